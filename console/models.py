"""The audit log (who did what, to which object, from what to what, and whether it was allowed),
and the tenants each user may see."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models


class AuditOutcome(models.TextChoices):
    OK = "ok", "done"
    DENIED = "denied", "denied (role)"
    REFUSED = "refused", "refused (state)"


class AuditEntry(models.Model):
    """Append-only: a database trigger refuses UPDATE and DELETE."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="+")
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=60)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=100)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    ip = models.GenericIPAddressField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=AuditOutcome.choices)
    message = models.TextField(blank=True, default="")
    # The tenant of the object the entry is about ("" for none: users, logins); the audit log
    # shows an entry only to users who may see that tenant (console/selectors/tenancy.py).
    tenant = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["actor_label", "-created_at"], name="audit_actor"),
            models.Index(fields=["action", "-created_at"], name="audit_action"),
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            models.Index(fields=["-created_at", "-id"], name="audit_keyset"),
            models.Index(fields=["tenant", "-created_at", "-id"], name="audit_tenant_keyset"),
        ]

    def __str__(self) -> str:
        return (f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} "
                f"{self.object_type}:{self.object_id} [{self.outcome}]")


class TenantScope(models.Model):
    """The tenants a user is limited to. No row: every tenant (the default); a row with an
    empty list: none. So removing a tenant from the list never widens what the user sees;
    only deleting the row does. Superusers see every tenant regardless."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="tenant_scope")
    tenants = ArrayField(models.CharField(max_length=100), default=list, blank=True,
                         help_text="Comma-separated. The user sees only these tenants' runs, effects, approvals "
                                   "and audit entries; empty: none. Delete this limit to let them see every tenant.")

    class Meta:
        verbose_name = "tenant limit"

    def __str__(self) -> str:
        return f"{self.user_id}: {', '.join(self.tenants) or '(no tenant)'}"


# --- bulk actions (console/services/bulk.py) ----------------------------------------------------


class BulkState(models.TextChoices):
    DRAFT = "draft", "previewed, not confirmed"
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    DONE = "done", "done"


class BulkOutcome(models.TextChoices):
    PENDING = "pending", "not done yet"
    OK = "ok", "done"
    REFUSED = "refused", "refused (state)"
    DENIED = "denied", "denied (role or tenant)"


class BulkBatch(models.Model):
    """One bulk action on many objects, by one person: previewed (``draft``), confirmed with a
    reason (``queued``), worked through by background jobs (``running``), ``done``.

    ``token`` is what the preview's confirmation carries: confirming it twice returns the same
    batch. The items and their expected states are fixed at the preview; the counters move in
    the same transactions as the items' outcomes, so they always add up."""

    token = models.UUIDField(unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    user_label = models.CharField(max_length=200)
    ip = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=40)  # a key of console.services.bulk.ACTIONS
    selection = models.JSONField(default=dict)  # {"ids": how many were ticked} or {"filter": {param: value}}
    # The tenant of every item if they share one (the batch's audit entry shows to its users), else "".
    tenant = models.CharField(max_length=100, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    outcome = models.CharField(max_length=40, blank=True, default="")  # effect.resolve: the outcome
    evidence = models.CharField(max_length=300, blank=True, default="")  # effect.resolve: the reference
    state = models.CharField(max_length=10, choices=BulkState.choices, default=BulkState.DRAFT)
    total = models.PositiveIntegerField(default=0)
    ok = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    denied = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # a job's last chunk: how stale it is
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "bulk batches"
        indexes = [models.Index(fields=["state", "heartbeat_at"], name="bulk_batch_state")]

    @property
    def done(self) -> int:
        return self.ok + self.refused + self.denied

    @property
    def pending(self) -> int:
        return self.total - self.done

    def __str__(self) -> str:
        return f"batch {self.id}: {self.action} × {self.total} by {self.user_label} [{self.state}]"


class BulkItem(models.Model):
    """One object of a batch, the state it had at the preview, and what became of it."""

    batch = models.ForeignKey(BulkBatch, on_delete=models.CASCADE, related_name="items")
    object_type = models.CharField(max_length=20)  # run, effect, approval
    object_id = models.CharField(max_length=100)
    expected = models.CharField(max_length=40)
    outcome = models.CharField(max_length=10, choices=BulkOutcome.choices, default=BulkOutcome.PENDING)
    message = models.TextField(blank=True, default="")
    acted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["batch", "object_type", "object_id"], name="bulk_item_once")]
        indexes = [models.Index(fields=["batch", "outcome", "id"], name="bulk_item_outcome")]

    def __str__(self) -> str:
        return f"{self.object_type} {self.object_id}: {self.outcome}"


# The notification models live with the rest of notifications; imported here so Django loads them.
from console.notifications.models import NotificationDelivery, NotificationEndpoint  # noqa: E402,F401

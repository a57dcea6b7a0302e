"""The console's own tables: bulk actions (``console/services/bulk.py``), single sign-on
identities (``console/services/sso.py``) and, from
``console/notifications``, notification endpoints and deliveries. The audit log and tenant
limits, which the HTTP API writes too, are in ``operators.models``."""

from __future__ import annotations

from django.conf import settings
from django.db import models


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
    version = models.PositiveIntegerField(null=True, blank=True)  # run.move / run.redrive: the target version
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


class SsoIdentity(models.Model):
    """The link between a console user and their identity at the OpenID Connect provider: the
    ID token's ``sub``, which the provider never reassigns (a username or an email may be).
    A user with a link signs in through the provider only (their local password is made
    unusable when the link is made); console/services/sso.py makes and reads it."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="sso_identity")
    subject = models.CharField(max_length=255, unique=True, help_text="the provider's sub claim")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"

    def __str__(self) -> str:
        return f"{self.user_id}: {self.subject}"


# The notification models live with the rest of notifications; imported here so Django loads them.
from console.notifications.models import NotificationDelivery, NotificationEndpoint  # noqa: E402,F401

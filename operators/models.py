"""The audit log (who did what, to which object, from what to what, and whether it was allowed),
and the tenants each user may see. Both were first made by the ``console`` app: their tables
keep its names (``console_auditentry``, ``console_tenantscope``), so a deployment's rows,
append-only trigger and grants stay as they were."""

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
    object_id = models.CharField(max_length=400)  # a name of up to 200 characters, or two of them (tenant/connector)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    ip = models.GenericIPAddressField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=AuditOutcome.choices)
    message = models.TextField(blank=True, default="")
    # The tenant of the object the entry is about ("" for none: users, logins); the audit log
    # shows an entry only to users who may see that tenant (operators/selectors/tenancy.py).
    tenant = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "console_auditentry"
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
        db_table = "console_tenantscope"
        verbose_name = "tenant limit"

    def __str__(self) -> str:
        return f"{self.user_id}: {', '.join(self.tenants) or '(no tenant)'}"


class DualState(models.TextChoices):
    PENDING = "PENDING", "waiting for a second person"
    CONFIRMED = "CONFIRMED", "confirmed and done"
    FAILED = "FAILED", "confirmed, but the action was refused"
    REFUSED = "REFUSED", "refused by the second person"
    WITHDRAWN = "WITHDRAWN", "withdrawn by the requester"
    EXPIRED = "EXPIRED", "not confirmed before its deadline"


class DualControlRequest(models.Model):
    """A dangerous action one person asked for, which a second one must confirm before the
    deadline (``operators.services.dual``). ``act`` and ``params`` are the action exactly as it
    was asked (the state the requester saw included), done as the confirmer once confirmed."""

    action = models.CharField(max_length=60)  # the role-checked action (run.compensate, effect.resolve...)
    policy = models.CharField(max_length=60)  # the dual-control rule that applied (effect.resolve_unsafe...)
    act = models.CharField(max_length=60)  # the service function that does it
    params = models.JSONField()
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=400)
    tenant = models.CharField(max_length=100, blank=True, default="")
    summary = models.CharField(max_length=300)  # what will happen, in words
    seen = models.JSONField(null=True, blank=True)  # the object as the requester's check found it
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_by_label = models.CharField(max_length=200)
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    deadline = models.DateTimeField()
    state = models.CharField(max_length=12, choices=DualState.choices, default=DualState.PENDING)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    decided_by_label = models.CharField(max_length=200, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True, default="")
    result = models.TextField(blank=True, default="")  # what the action answered, or why it was refused

    class Meta:
        indexes = [
            models.Index(fields=["deadline", "id"], name="dual_pending",
                         condition=models.Q(state="PENDING")),
            models.Index(fields=["object_type", "object_id"], name="dual_object"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} {self.object_type}:{self.object_id} [{self.state}]"

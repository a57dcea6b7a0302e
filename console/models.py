"""The audit log: who did what, to which object, from what to what, and whether it was allowed."""

from __future__ import annotations

from django.conf import settings
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
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["actor_label", "-created_at"], name="audit_actor"),
            models.Index(fields=["action", "-created_at"], name="audit_action"),
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            models.Index(fields=["-created_at", "-id"], name="audit_keyset"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_type}:{self.object_id} [{self.outcome}]"

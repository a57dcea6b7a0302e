"""Outbound webhooks: the endpoints staff configure, and one delivery per (endpoint, item, kind).

A delivery is created once, when its item is first seen needing a person (``detect``), and is
sent by a run of the system workflow ``system.notify`` whose business key is the delivery's id:
the run's one effect is the POST, so the ledger's rules decide what a crash means (never a
second send: an unclear outcome is UNKNOWN). The delivery row itself holds no state; its state
is read from that run and effect (``selectors.DeliveryRow.state``).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from core.webhook_secrets import WebhookSecret


class NotificationKind(models.TextChoices):
    UNKNOWN_EFFECT = "unknown_effect", "UNKNOWN effect"
    APPROVAL_WAITING = "approval_waiting", "approval waiting"
    COMPENSATION_FAILED = "compensation_failed", "failed compensation"
    VERSION_MISMATCH = "version_mismatch", "version mismatch (stranded run)"
    RUN_FAILED = "run_failed", "FAILED run"
    CIRCUIT_OPENED = "circuit_opened", "connector circuit opened"
    CIRCUIT_CLOSED = "circuit_closed", "connector circuit closed"
    DUAL_CONTROL = "dual_control", "dangerous action waiting for a second person"


class NotificationFormat(models.TextChoices):
    SLACK = "slack", "Slack-compatible ({text, blocks})"
    GENERIC = "generic", "generic JSON"


class NotificationEndpoint(WebhookSecret):
    """Where notifications go. ``kinds``: which kinds (empty: none); ``tenants``: which tenants'
    items (empty: every tenant). ``secret`` signs every body (Standard Webhooks; endpoints made
    before keep the legacy scheme until their secret is rotated: ``core.webhook_secrets``); it is
    shown only on the staff page and never written to the audit log, a run or an effect."""

    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500)
    format = models.CharField(max_length=10, choices=NotificationFormat.choices, default=NotificationFormat.GENERIC)
    kinds = ArrayField(models.CharField(max_length=30, choices=NotificationKind.choices), default=list, blank=True)
    tenants = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    secret = models.CharField(max_length=100)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"

    def wants(self, kind: str, tenant: str) -> bool:
        return self.active and kind in self.kinds and (not self.tenants or tenant in self.tenants)


class NotificationDelivery(models.Model):
    """One notification of one item to one endpoint. Unique per (endpoint, kind, item): an item
    seen again (a second signal, the sweeper's pass, two processes at once) adds nothing.

    An item is about a run (``run_id``, its ``tenant``, ``workflow`` and ``business_key``) or, for
    a connector's circuit (``circuit:<CircuitChange id>``), about no run and no tenant (all empty)."""

    endpoint = models.ForeignKey(NotificationEndpoint, on_delete=models.PROTECT, related_name="deliveries")
    kind = models.CharField(max_length=30, choices=NotificationKind.choices)
    item = models.CharField(max_length=100, help_text="effect:<id>, approval:<id>, run:<uuid> or circuit:<id>")
    run_id = models.UUIDField(null=True, blank=True,
                              help_text="the run that needs a person; empty for a connector's circuit")
    tenant = models.CharField(max_length=100)
    workflow = models.CharField(max_length=200)
    business_key = models.CharField(max_length=200, blank=True, default="")
    summary = models.TextField()
    body = models.JSONField(help_text="what is POSTed, already redacted")
    notify_run_id = models.UUIDField(null=True, blank=True, help_text="the system.notify run that sends it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "notification deliveries"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "kind", "item"], name="notification_once_per_item"),
        ]
        indexes = [models.Index(fields=["-created_at", "-id"], name="notification_keyset")]

    def __str__(self) -> str:
        return f"{self.kind} {self.item} -> {self.endpoint_id}"

"""API keys for service accounts, and the signed webhooks that come in (``api/``).

A key acts as its own user (``api:<name>``, no password, the key's role as its group and its
tenants as its ``TenantScope``), so every role check, tenant limit, four-eyes rule and audit
entry of the console applies to it unchanged. Only a hash of the secret is stored.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.webhook_secrets import WebhookSecret


class ApiKey(models.Model):
    name = models.SlugField(max_length=60, unique=True)
    # The key is "sk_<prefix>_<secret>": the prefix finds the row, the secret's SHA-256 checks it.
    prefix = models.CharField(max_length=12, unique=True)
    secret_hash = models.CharField(max_length=64)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_key")
    role = models.CharField(max_length=20)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, default="")
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Requests per minute this key may make (0: no limit).
    rate_per_minute = models.PositiveIntegerField(default=600)

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> str:
        """ACTIVE, EXPIRED or REVOKED (revoked wins: it was a person's decision)."""
        if self.revoked_at is not None:
            return "REVOKED"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "EXPIRED"
        return "ACTIVE"


class Hook(WebhookSecret):
    """A signed webhook in: ``POST /api/v1/hooks/<name>`` with an HMAC over (id,) timestamp and
    body, turned into signal ``signal`` for the run the body names (run id or business key).
    Made with a Standard Webhooks secret; hooks made before keep the legacy scheme until
    ``manage.py rotatehook`` (``core.webhook_secrets``)."""

    name = models.SlugField(max_length=60, unique=True)
    secret = models.CharField(max_length=200)  # needed in clear to check the HMAC; shown once
    signal = models.CharField(max_length=200)
    workflow = models.CharField(max_length=200, blank=True, default="")  # for a business-key lookup
    tenant = models.CharField(max_length=100, default="default")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class HookReceipt(models.Model):
    """A delivery that was accepted: its signature can never be accepted again (replay), nor its
    event id (a Standard Webhooks ``webhook-id``, or a legacy body's ``event_id``) signal twice."""

    hook = models.ForeignKey(Hook, on_delete=models.CASCADE, related_name="receipts")
    signature = models.CharField(max_length=128)
    # The sender's id of the message: the webhook-id header (Standard Webhooks), or for a legacy
    # hook the body's "event_id" when it sends one. A retry it re-signs with a new timestamp is then
    # answered as delivered, without a second signal.
    event_id = models.CharField(max_length=200, blank=True, default="")
    run_id = models.UUIDField(null=True, blank=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hook", "signature"], name="hook_receipt_once"),
            models.UniqueConstraint(fields=["hook", "event_id"], condition=~models.Q(event_id=""),
                                    name="hook_receipt_event_once"),
        ]

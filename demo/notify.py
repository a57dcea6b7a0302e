"""``make demo``'s notification endpoint: the demo providers' webhook receiver.

Every kind but ``approval_waiting``: the demo's bot approves two shipments in three within a
second of their request, so that kind would mostly announce approvals already decided. Tick it
on the endpoint's page (Notifications → Configure endpoints) to see it."""

from __future__ import annotations

from django.conf import settings

from console.notifications.models import NotificationEndpoint, NotificationFormat, NotificationKind
from core.webhooks import SignatureScheme

DEMO_ENDPOINT_NAME = "demo receiver"


def demo_endpoint_configure(*, providers_url: str) -> NotificationEndpoint:
    """Point the demo endpoint at ``providers_url``'s receiver (created the first time, updated after:
    the providers' port changes from one demo to the next), signing with ``DEMO_WEBHOOK_SECRET``
    (Standard Webhooks, as the receiver checks)."""
    endpoint, _ = NotificationEndpoint.objects.update_or_create(
        name=DEMO_ENDPOINT_NAME,
        defaults={"url": providers_url.rstrip("/") + "/webhook/receive", "format": NotificationFormat.GENERIC,
                  "kinds": [k for k in NotificationKind.values if k != NotificationKind.APPROVAL_WAITING],
                  "tenants": [], "active": True,
                  "secret": settings.DEMO_WEBHOOK_SECRET, "signature_scheme": SignatureScheme.STANDARD,
                  "previous_secret": "", "previous_scheme": "", "previous_until": None},
    )
    return endpoint

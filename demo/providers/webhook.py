"""The demo's webhook receiver: what a team's chat or pager would be, for Saga Console's
notifications (``POST /webhook/receive``; ``GET /webhook/`` lists what arrived).

It checks each arrival the way a receiver written by another team would, on its own, with nothing
but the shared secret (``DEMO_WEBHOOK_SECRET``) and the ``standardwebhooks`` library:
``Webhook(secret).verify(raw_body, headers)`` (``webhook-signature`` over ``<webhook-id>.
<webhook-timestamp>.<raw body>``, the timestamp within 5 minutes). Every arrival is stored
(``WebhookArrival``), signed or not, and committed before the answer: 200 for a good signature,
401 for a bad one. It does not dedupe by ``webhook-id`` (our ``Idempotency-Key``), so the table
counts every POST that reached it: a notification sent twice shows as two rows with one key.
"""

from __future__ import annotations

import html
import json
from typing import Any

from django.conf import settings
from django.db import transaction
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from demo.models import WebhookArrival
from demo.providers.services import Reply

PAGE_ROWS = 200


def signature_ok(secret: str, raw: bytes, headers: Any) -> bool:
    try:
        Webhook(secret).verify(raw, {str(k): str(v) for k, v in headers.items()}, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def receive(*, key: str, raw: bytes, headers: Any) -> Reply:
    ok = signature_ok(settings.DEMO_WEBHOOK_SECRET, raw, headers)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {"unparsed": raw[:2000].decode(errors="replace")}
    if not isinstance(body, dict):
        body = {"value": body}
    with transaction.atomic():
        arrival = WebhookArrival.objects.create(
            idempotency_key=key[:255], delivery=str(headers.get("X-Saga-Delivery", ""))[:50],
            signature_ok=ok, kind=str(body.get("kind", ""))[:30], summary=_summary(body)[:1000], body=body,
        )
    if not ok:
        return Reply(401, {"error": "bad or missing webhook-signature (or a stale webhook-timestamp)",
                           "arrival": arrival.id})
    return Reply(200, {"received": arrival.id})


def _summary(body: dict[str, Any]) -> str:
    if isinstance(body.get("summary"), str):
        return body["summary"]
    return str(body.get("text", ""))


def arrivals_page() -> bytes:
    """The newest arrivals as an HTML page (every value escaped; no script, no inline style)."""
    rows = []
    for a in WebhookArrival.objects.order_by("-id")[:PAGE_ROWS]:
        signed = "signature ok" if a.signature_ok else "BAD SIGNATURE (refused)"
        rows.append(
            f"<tr><td>{a.id}</td><td>{a.received_at:%Y-%m-%d %H:%M:%S}</td><td>{html.escape(signed)}</td>"
            f"<td>{html.escape(a.kind)}</td><td>{html.escape(a.delivery)}</td>"
            f"<td><bdi>{html.escape(a.summary)}</bdi></td><td><code>{html.escape(a.idempotency_key)}</code></td></tr>"
        )
    total = WebhookArrival.objects.count()
    table = ("<table border=\"1\" cellpadding=\"4\"><thead><tr><th>#</th><th>received (UTC)</th><th>signature</th>"
             "<th>kind</th><th>delivery</th><th>summary</th><th>Idempotency-Key</th></tr></thead><tbody>"
             + "".join(rows) + "</tbody></table>") if rows else "<p>Nothing has arrived yet.</p>"
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"3\">"
        "<title>Webhook receiver · demo providers</title></head><body>"
        f"<h1>Webhook receiver</h1><p>{total} arrival(s); the newest {PAGE_ROWS} below, newest first "
        "(this page reloads every 3 s).</p>" + table + "</body></html>"
    ).encode()

"""Signed webhooks in: ``POST /api/v1/hooks/<name>`` turns a verified body into a signal
(``api.hooks``). Not authenticated by API key: the signature is the authentication."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Field, Router, Schema

from api.auth import actor_ip
from api.errors import Problem
from api.hooks import (
    LEGACY_SIGNATURE_HEADER,
    LEGACY_TIMESTAMP_HEADER,
    MAX_BODY_BYTES,
    TOLERANCE_S,
    hook_deliver,
)
from core.webhooks import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER

router = Router(tags=["hooks"])

DESCRIPTION = f"""A webhook from a provider (a payment's `settled` callback...) becomes the hook's signal
for the run the body names, waking a `ctx.wait_for(<signal>)`. No API key: the signature is the
authentication (`manage.py createhook NAME --signal S` prints the hook's secret once).

**Signature**: [Standard Webhooks](https://www.standardwebhooks.com/), so any library of the spec signs it
(Python: `Webhook(secret).sign(msg_id, timestamp, body)`). Send `{ID_HEADER}: <the message's id, the same on
every retry>`, `{TIMESTAMP_HEADER}: <unix seconds>` and `{SIGNATURE_HEADER}: v1,<base64 HMAC-SHA256>` keyed
with the base64-decoded part of the `whsec_<base64>` secret, over `"<{ID_HEADER}>.<{TIMESTAMP_HEADER}>.<raw
body>"`, the raw body bytes exactly as sent. Several space-separated `v1,` entries are allowed (rotating a
secret). A timestamp more than {TOLERANCE_S // 60} minutes old or ahead is refused (401 `signature`, saying
why). A `{ID_HEADER}` this hook accepted before (a retry, re-signed or not) is answered 200 with
`duplicate: true` and sends no second signal.

**Legacy hooks** (made before Standard Webhooks, until `manage.py rotatehook NAME` gives them a new secret):
`{LEGACY_TIMESTAMP_HEADER}: <unix seconds>` and `{LEGACY_SIGNATURE_HEADER}: v1=<hex HMAC-SHA256(secret,
"<timestamp>.<raw body>")>` (comma-separated entries); a signature accepted once is refused for good (409
`replay`), and the body's `event_id` dedupes as `{ID_HEADER}` does.

**Body** (JSON object, at most {MAX_BODY_BYTES // 1024} KiB, else 413): `{{"run_id": "<uuid>"}}` or
`{{"business_key": "...", "workflow": "..."}}` (`workflow` optional when the hook names one or the key is
unique), plus `"payload"`: the signal's payload (without it, the whole body is the payload). A hook only
reaches runs of its tenant (and of its workflow, when it names one).

**Answers**: 200 the signal was sent (journaled, audited as `system: hook <name>`), or `duplicate: true`; 401
`signature`; 404 `not-found` (no enabled hook of that name, or no such run for it); 400 `validation` (not a
JSON object naming a run); 409 `replay` (legacy); 409 `conflict` (the run is finished); 413
`payload-too-large`."""

_BODY_SCHEMA = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string", "format": "uuid"},
        "business_key": {"type": "string", "maxLength": 200},
        "workflow": {"type": "string"},
        "payload": {"description": "the signal's payload (any JSON); without it, the whole body"},
        "event_id": {"type": "string", "maxLength": 200,
                     "description": f"legacy hooks only (a standard one reads {ID_HEADER}): the sender's id of the "
                                    "event; a retry of an accepted one answers 200 with duplicate true and sends no "
                                    "second signal"},
    },
}


class HookOut(Schema):
    hook: str
    run_id: str
    signal: str = Field(..., description="the signal sent to the run")
    run_status: str = Field(..., description="the run's status after the signal (PENDING when it was waiting)")
    duplicate: bool = Field(False, description=f"this {ID_HEADER} (a legacy hook: the body's event_id) was accepted "
                                               "before: no second signal was sent")


@router.post(
    "/{name}", auth=None, response={200: HookOut}, summary="Receive a signed webhook (a signal for a run)",
    description=DESCRIPTION,
    openapi_extra={
        # Not "required": a hook takes either the Standard Webhooks set or, a legacy hook, the
        # X-Saga set, and OpenAPI cannot say "one of two sets"; a request with neither is a 401.
        "parameters": [
            {"in": "header", "name": ID_HEADER, "required": False,
             "description": "Standard Webhooks: the message's id, the same on every retry (dedupes)",
             "schema": {"type": "string", "minLength": 1, "maxLength": 200}},
            {"in": "header", "name": TIMESTAMP_HEADER, "required": False,
             "description": "Standard Webhooks: unix seconds of this attempt", "schema": {"type": "integer"}},
            {"in": "header", "name": SIGNATURE_HEADER, "required": False,
             "description": "Standard Webhooks: space-separated `v1,<base64>` entries",
             "schema": {"type": "string"}},
            {"in": "header", "name": LEGACY_TIMESTAMP_HEADER, "required": False, "deprecated": True,
             "description": "legacy hooks only: unix seconds", "schema": {"type": "integer"}},
            {"in": "header", "name": LEGACY_SIGNATURE_HEADER, "required": False, "deprecated": True,
             "description": "legacy hooks only: comma-separated `v1=<hex>` entries", "schema": {"type": "string"}},
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}},
        "responses": {"401": {
            "description": "the signature is missing, stale, from the future or wrong (`signature`: the detail "
                           "says which)",
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}},
    },
)
def receive_hook(request: HttpRequest, name: str) -> dict[str, object]:
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > MAX_BODY_BYTES:  # refused before the body is read
        raise Problem("payload-too-large", f"a hook body may hold at most {MAX_BODY_BYTES} bytes")
    delivery = hook_deliver(name=name, headers=request.headers, body=request.body, ip=actor_ip(request))
    return {"hook": delivery.hook.name, "run_id": str(delivery.run.id), "signal": delivery.signal,
            "run_status": delivery.run.status, "duplicate": delivery.duplicate}

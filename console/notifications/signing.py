"""How a notification's body is signed, so that a receiver can check it with the secret alone.

Standard Webhooks (``core.webhooks``, with the ``standardwebhooks`` library): ``webhook-id`` is
the delivery's effect key (the same on every retry: a receiver dedupes on it),
``webhook-timestamp`` the attempt's unix seconds (each retry is signed anew), and
``webhook-signature`` ``v1,<base64>`` over ``<webhook-id>.<webhook-timestamp>.<raw body>``,
keyed with the bytes of the endpoint's ``whsec_<base64>`` secret. A receiver written with the
library checks it with ``Webhook(secret).verify(raw_body, headers)``.

An endpoint made before that (``SignatureScheme.LEGACY``) is signed as it always was, until its
secret is rotated: ``X-Saga-Timestamp: <unix seconds>`` and ``X-Saga-Signature: sha256=<hex>``,
HMAC-SHA256 keyed with the whole secret text over ``<timestamp>.<raw body>``. While a rotation's
overlap lasts, both sets of headers (or two ``v1`` entries) are sent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from console.notifications.models import NotificationEndpoint
from core import webhooks
from core.webhooks import SignatureScheme

LEGACY_TIMESTAMP_HEADER = "X-Saga-Timestamp"
LEGACY_SIGNATURE_HEADER = "X-Saga-Signature"


class BadSecret(ValueError):
    """The endpoint's secret cannot sign with its scheme (set by hand?): nothing may be sent."""


def encode(body: Any) -> bytes:
    """The bytes sent (and signed) for ``body``."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")


def legacy_signature(secret: str, timestamp: int | str, raw: bytes) -> str:
    digest = hmac.new(secret.encode("utf-8"), str(timestamp).encode("ascii") + b"." + raw, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def signed_headers(endpoint: NotificationEndpoint, *, msg_id: str, raw: bytes,
                   now: float | None = None) -> dict[str, str]:
    """The signature headers of one attempt to POST ``raw`` as message ``msg_id`` to ``endpoint``."""
    timestamp = int(time.time() if now is None else now)
    headers: dict[str, str] = {}
    standard = endpoint.secrets_in_use(SignatureScheme.STANDARD)
    if not all(webhooks.is_standard_secret(s) for s in standard):
        raise BadSecret("its secret is not a Standard Webhooks secret (whsec_ and base64); make a new one")
    if standard:
        headers.update(webhooks.signed_headers(standard, msg_id=msg_id, body=raw, timestamp=timestamp))
    legacy = endpoint.secrets_in_use(SignatureScheme.LEGACY)
    if legacy:  # one at most: a rotation always issues a standard secret
        headers.update({LEGACY_TIMESTAMP_HEADER: str(timestamp),
                        LEGACY_SIGNATURE_HEADER: legacy_signature(legacy[0], timestamp, raw)})
    return headers

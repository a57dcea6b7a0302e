"""Standard Webhooks (standardwebhooks.com) for both directions: the notifications we send and
the hooks we receive. The HMAC itself is the ``standardwebhooks`` library's (``Webhook.sign`` and
``Webhook.verify``), so a sender or receiver written with it and ours agree byte for byte.

The scheme: ``webhook-id`` (the message's id, the same on every retry of one message),
``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``, space-separated
``v1,<base64 HMAC-SHA256>`` entries over ``<webhook-id>.<webhook-timestamp>.<raw body bytes>``,
keyed with the bytes a ``whsec_<base64>`` secret encodes. One matching entry is enough (a sender
rotating its secret signs with both); a timestamp more than ``TOLERANCE_SECONDS`` from the
receiver's clock is refused.

``SignatureScheme.LEGACY`` ("saga-v1") names the scheme used before: the whole ``whsec_<token>``
text as the HMAC key over ``<timestamp>.<raw body>`` in ``X-Saga-Signature``. It is never issued
again; an endpoint or hook made before keeps it until its secret is rotated (its secret is not
base64, so the library would key the HMAC with the wrong bytes). The legacy formats live with
their one user each (``console.notifications.signing``, ``api.hooks``).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from django.db import models
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
TOLERANCE_SECONDS = 300  # the library's own tolerance (5 minutes): ours must not differ
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
MAX_ID_CHARS = 200
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


class SignatureScheme(models.TextChoices):
    STANDARD = "standard", "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)"
    LEGACY = "saga-v1", "legacy (X-Saga-Timestamp, X-Saga-Signature)"


class Refused(Exception):
    """A delivery whose signature headers do not verify; the message says which check failed."""


def new_secret() -> str:
    """A new secret in the spec's form: ``whsec_`` and the standard base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def is_standard_secret(secret: str) -> bool:
    """True when ``secret`` is ``whsec_<standard base64>`` of 24 to 64 bytes: a key the library
    decodes to exactly the bytes it encodes (a legacy token with ``-`` or ``_`` is not)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    if not _BASE64.fullmatch(encoded):
        return False
    unpadded = encoded.rstrip("=")
    try:
        key = base64.b64decode(unpadded + "=" * (-len(unpadded) % 4), validate=True)
    except binascii.Error:
        return False
    return 24 <= len(key) <= 64


def sign(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` entry for ``body`` sent as message ``msg_id`` at ``timestamp``."""
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=UTC), body)


def signed_headers(secrets_: Sequence[str], *, msg_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The three headers of one attempt, signed with every secret in ``secrets_`` (the current
    one, and the previous one while a rotation's overlap lasts)."""
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(sign(s, msg_id=msg_id, timestamp=timestamp, body=body) for s in secrets_),
    }


def has_headers(headers: Mapping[str, str]) -> bool:
    """True when the request carries any Standard Webhooks header (``headers`` lower-cased)."""
    return any(headers.get(h) for h in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER))


def verify(secrets_: Sequence[str], *, headers: Mapping[str, str], body: bytes) -> tuple[str, str]:
    """``(webhook-id, the matching v1 entry)`` when one of ``secrets_`` signed ``body`` with these
    ``headers`` (keys lower-cased) within the tolerance; ``Refused`` saying why otherwise.

    The headers and the timestamp are checked here first, so a refusal names the header and how
    far off the clock is; then ``Webhook.verify`` decides (with its own clock), once per secret."""
    msg_id, timestamp, signature = (headers.get(h, "").strip() for h in (ID_HEADER, TIMESTAMP_HEADER,
                                                                            SIGNATURE_HEADER))
    if not (msg_id and timestamp and signature):
        raise Refused(f"send the {ID_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers (Standard Webhooks)")
    if len(msg_id) > MAX_ID_CHARS or not msg_id.isprintable():
        raise Refused(f"{ID_HEADER} must be at most {MAX_ID_CHARS} printable characters")
    if not timestamp.isdigit() or len(timestamp) > 12:
        raise Refused(f"{TIMESTAMP_HEADER} must be unix seconds (an integer)")
    sent_at, now = int(timestamp), time.time()
    if sent_at < now - TOLERANCE_SECONDS:
        raise Refused(f"the timestamp is {int(now - sent_at)} s old; at most {TOLERANCE_SECONDS} s are accepted")
    if sent_at > now + TOLERANCE_SECONDS:
        raise Refused(f"the timestamp is {int(sent_at - now)} s in the future; at most {TOLERANCE_SECONDS} s are "
                      "accepted (check the sender's clock)")
    given = {ID_HEADER: msg_id, TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature}
    for secret in secrets_:
        try:
            Webhook(secret).verify(body, given, json_parse=False)
        except WebhookVerificationError:
            continue
        return msg_id, sign(secret, msg_id=msg_id, timestamp=sent_at, body=body)
    raise Refused(f"no v1 entry of {SIGNATURE_HEADER} matches: base64 HMAC-SHA256 keyed with the base64-decoded "
                  f"secret over '<{ID_HEADER}>.<{TIMESTAMP_HEADER}>.<raw body>'")

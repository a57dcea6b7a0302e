"""How a webhook body is signed, and how a receiver checks it.

``X-Saga-Timestamp: <unix seconds>`` and ``X-Saga-Signature: sha256=<hex>``, where the hex is
HMAC-SHA256 with the endpoint's secret over ``<timestamp>.<raw body bytes>``. A receiver
recomputes it over the bytes it received (never a re-encoded body), compares in constant time,
and refuses a timestamp too far from its clock (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any

TIMESTAMP_HEADER = "X-Saga-Timestamp"
SIGNATURE_HEADER = "X-Saga-Signature"
TOLERANCE_SECONDS = 300


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def encode(body: Any) -> bytes:
    """The bytes sent (and signed) for ``body``."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")


def signature(secret: str, timestamp: int | str, raw: bytes) -> str:
    digest = hmac.new(secret.encode("utf-8"), str(timestamp).encode("ascii") + b"." + raw, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def signed_headers(secret: str, raw: bytes, *, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature(secret, timestamp, raw)}


def verify(secret: str, timestamp: str, given: str, raw: bytes, *, now: float | None = None) -> bool:
    """True when ``given`` is the signature of ``raw`` at ``timestamp`` and that timestamp is
    within ``TOLERANCE_SECONDS`` of now."""
    if not timestamp.isdigit() or not given:
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    return hmac.compare_digest(signature(secret, timestamp, raw), given.strip())

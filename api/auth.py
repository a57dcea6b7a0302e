"""Who calls: ``Authorization: Bearer sk_...``, checked against ``ApiKey``; then the key's rate.

The rate limit is a fixed one-minute window per key in Redis (``INCR`` + ``EXPIRE``). Redis
down does not stop the API (PostgreSQL is the source of truth and the API's work is there): the
limit is then not enforced, and that is logged once per outage.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from api.errors import Problem
from api.keys import apikey_check
from api.models import ApiKey
from core.storage import is_redis_error

log = logging.getLogger("api")
_redis_down = False
# last_used_at is written at most this often per key (a write per request would be a hot row).
LAST_USED_EVERY_S = 60


class ApiRequest(HttpRequest):
    """A request that ``ApiKeyAuth`` let in, as the type checker sees it (at run time it is
    Django's own): ``auth`` is the caller's ``ApiKey`` and ``user`` that key's user."""

    auth: ApiKey
    user: User


class ApiKeyAuth(HttpBearer):
    """The bearer token is an API key; ``request.auth`` is the ``ApiKey``, ``request.user`` its user."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        key = apikey_check(token)
        if key is None:
            return None
        request.user = key.user
        rate_limit(key)
        now = timezone.now()
        if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_EVERY_S:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return key


def rate_limit(key: ApiKey) -> None:
    """``Problem("rate-limited")`` once ``key`` made more than its ``rate_per_minute`` requests
    in the current minute; ``retry_after`` says when the window ends."""
    global _redis_down
    if not key.rate_per_minute:
        return
    from sagas.integration import redis_connection

    window = int(time.time() // 60)
    name = f"saga:api:rate:{key.pk}:{window}"
    try:
        conn = redis_connection()
        pipe = conn.pipeline()
        pipe.incr(name)
        pipe.expire(name, 120)
        count = int(pipe.execute()[0])
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        if not _redis_down:
            log.warning("api rate limits not enforced: Redis unavailable (%s)", exc)
        _redis_down = True
        return
    if _redis_down:
        log.warning("api rate limits enforced again: Redis is back")
        _redis_down = False
    if count > key.rate_per_minute:
        raise Problem("rate-limited", f"key {key.name} may make {key.rate_per_minute} requests a minute",
                      retry_after=60 - int(time.time()) % 60)


def actor_ip(request: HttpRequest) -> Any:
    return request.META.get("REMOTE_ADDR")

"""The simulated providers' own rate limits, as a real payments or email API has them.

``limit(provider, operation, per_second)`` sets one (a ``ProviderLimit`` row). The server keeps
the arrival times of the requests it let through in the last second, per operation, in memory
(one server process, a lock around each check), and answers 429 with ``Retry-After: 1`` to a
request that would make more than ``per_second`` in any one-second window. Nothing is executed
then, and ``ProviderLimit.refused`` counts it. The limit is read from the table on each request,
so a test that sets one sees it on the next request.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from django.db.models import F
from django.db.models.functions import Greatest

from demo.models import ProviderLimit
from demo.providers.errors import ProviderError

WINDOW_SECONDS = 1.0

_lock = threading.Lock()
_arrivals: dict[tuple[str, str], deque[float]] = {}
_serving: dict[tuple[str, str], int] = {}


def limit(provider: str, operation: str, per_second: int | None) -> None:
    """Set (or with None, lift) the provider's rate limit on ``provider``/``operation``."""
    if per_second is None:
        ProviderLimit.objects.filter(provider=provider, operation=operation).delete()
        return
    if per_second < 1:
        raise ValueError(f"per_second must be at least 1, not {per_second}")
    ProviderLimit.objects.update_or_create(provider=provider, operation=operation,
                                           defaults={"per_second": per_second, "refused": 0, "peak_in_flight": 0})


def refused(provider: str, operation: str) -> int:
    row = ProviderLimit.objects.filter(provider=provider, operation=operation).first()
    return row.refused if row is not None else 0


def admit(provider: str, operation: str) -> None:
    """Let the request through, or raise ``ProviderError(429)`` (nothing executed)."""
    per_second = ProviderLimit.objects.filter(provider=provider, operation=operation).values_list(
        "per_second", flat=True).first()
    if per_second is None:
        return
    now = time.monotonic()
    with _lock:
        window = _arrivals.setdefault((provider, operation), deque())
        while window and window[0] <= now - WINDOW_SECONDS:
            window.popleft()
        if len(window) < per_second:
            window.append(now)
            return
    ProviderLimit.objects.filter(provider=provider, operation=operation).update(refused=F("refused") + 1)
    raise ProviderError(429, f"rate limit of {per_second} requests per second exceeded; nothing was executed",
                        retry_after=1)


def enter(provider: str, operation: str) -> None:
    """A request to ``provider``/``operation`` starts being served: count it, keep the peak."""
    with _lock:
        serving = _serving[(provider, operation)] = _serving.get((provider, operation), 0) + 1
    ProviderLimit.objects.filter(provider=provider, operation=operation, peak_in_flight__lt=serving).update(
        peak_in_flight=Greatest(F("peak_in_flight"), serving))


def leave(provider: str, operation: str) -> None:
    with _lock:
        _serving[(provider, operation)] -= 1


def peak_in_flight(provider: str, operation: str) -> int:
    row = ProviderLimit.objects.filter(provider=provider, operation=operation).first()
    return row.peak_in_flight if row is not None else 0

"""Fault injection for the simulated providers.

A fault reaches a request in one of two ways: the request's ``X-Fault`` header,
or a ``ProviderFault`` row for its (provider, operation) with ``remaining > 0``.
The header wins and leaves the rows alone. A row is consumed by one atomic
decrement per request, so a fault injected ``times=n`` acts on exactly n
requests, concurrent ones included.

Faults (``name`` or ``name:seconds``):

======================== ====================================================
``latency:<s>``          sleep ``s`` seconds, then work normally
``error_before_work``    503, nothing executed
``final``                422, nothing executed
``timeout_after_work``   work and commit, then sleep (default 10 s, longer
                         than any client timeout) before answering
``kill_caller_after_work`` work and commit, then SIGKILL the pid in the
                         ``X-Caller-Pid`` header and close without answering
======================== ====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from demo.models import ProviderFault
from demo.providers.errors import ProviderError

LATENCY = "latency"
ERROR_BEFORE_WORK = "error_before_work"
FINAL = "final"
TIMEOUT_AFTER_WORK = "timeout_after_work"
KILL_CALLER_AFTER_WORK = "kill_caller_after_work"

BEFORE_WORK = frozenset({LATENCY, ERROR_BEFORE_WORK, FINAL})
AFTER_WORK = frozenset({TIMEOUT_AFTER_WORK, KILL_CALLER_AFTER_WORK})
DEFAULT_SECONDS = {LATENCY: None, TIMEOUT_AFTER_WORK: 10.0}


@dataclass(frozen=True)
class Fault:
    name: str
    seconds: float = 0.0

    @property
    def before_work(self) -> bool:
        return self.name in BEFORE_WORK


def parse(spec: str) -> Fault:
    """``"latency:0.5"`` -> ``Fault("latency", 0.5)``. Raises ``ProviderError(400)`` on anything unknown."""
    name, sep, arg = spec.strip().partition(":")
    if name not in BEFORE_WORK | AFTER_WORK:
        raise ProviderError(400, f"unknown fault {spec!r}")
    if not sep:
        default = DEFAULT_SECONDS.get(name, 0.0)
        if default is None:
            raise ProviderError(400, f"fault {name!r} needs seconds, e.g. {name}:0.5")
        return Fault(name, default)
    if name not in DEFAULT_SECONDS:
        raise ProviderError(400, f"fault {name!r} takes no argument")
    try:
        seconds = float(arg)
    except ValueError:
        raise ProviderError(400, f"fault {spec!r}: {arg!r} is not a number of seconds") from None
    if not 0 <= seconds <= 600:
        raise ProviderError(400, f"fault {spec!r}: seconds must be between 0 and 600")
    return Fault(name, seconds)


def inject(provider: str, operation: str, fault: str, times: int = 1) -> ProviderFault:
    """Make the next ``times`` requests to ``provider``/``operation`` suffer ``fault``."""
    try:
        parse(fault)
    except ProviderError as exc:
        raise ValueError(exc.message) from None
    if times < 1:
        raise ValueError(f"times must be at least 1, not {times}")
    return ProviderFault.objects.create(provider=provider, operation=operation, fault=fault, remaining=times)


def clear() -> None:
    """Remove every injected fault, spent or not."""
    ProviderFault.objects.all().delete()


def take(provider: str, operation: str) -> str | None:
    """Consume one use of the oldest live fault for (provider, operation); its spec, or None.

    The decrement is one conditional UPDATE; a request that loses a race for a
    row tries the next one, so no use is lost and none is given twice.
    """
    table = ProviderFault._meta.db_table
    live = ProviderFault.objects.filter(provider=provider, operation=operation, remaining__gt=0).order_by("id")
    while True:
        candidate = live.values_list("id", flat=True).first()
        if candidate is None:
            return None
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE {table} SET remaining = remaining - 1 WHERE id = %s AND remaining > 0 RETURNING fault",
                [candidate],
            )
            row = cur.fetchone()
        if row is not None:
            return row[0]

"""Spend limits per tenant and connector per UTC day, in the runs' cost unit (usd).

What is spent: a model turn's price (``ctx.add_cost(..., connector=...)``; ``run_agent`` charges
its turns to ``MODEL``) and an effect's ``Connector.cost(payload, result)``, each added to the
day's ``SpendDay`` in the transaction that journals it, so a cost is counted once, replays and
crashes included. What is checked: before a call or a model turn goes out for real, the day's
spend against the tenant's limit (its own row, else the ``"*"`` row); at or over it, the engine
parks the run (NEEDS_ATTENTION, ``spend_limit``, with the figures). Raising the limit, or the next
UTC day, lets the sweeper resume it.

A limit is checked before a call, not reserved: calls that start together may each pass and
together go over by up to their own costs. The limit bounds what is started after it is reached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date
from decimal import Decimal
from typing import Any

from django.db import connection
from django.utils import timezone

from ledger.models import SpendLimit

# What a model turn of ``run_agent`` is charged to.
MODEL = "model"
# How long a process trusts its list of connectors that have a spend limit (a connector without
# one costs no query per call).
LIMITED_TTL_SECONDS = 2.0

_limited: tuple[float, frozenset[str]] = (0.0, frozenset())


@dataclass(frozen=True)
class Over:
    """A tenant at or over its day's limit on a connector: the figures a person sees."""

    tenant: str
    connector: str
    day: date
    spent: Decimal
    limit: Decimal

    def describe(self) -> str:
        return (f"tenant {self.tenant!r} has spent {self.spent:.4f} of its {self.limit:.4f} usd limit on "
                f"{self.connector} today ({self.day:%Y-%m-%d} UTC)")

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "connector": self.connector, "day": self.day.isoformat(),
                "spent": float(self.spent), "limit": float(self.limit)}


def today() -> date:
    """The UTC day spend is counted in."""
    return timezone.now().astimezone(UTC).date()


def _limited_connectors() -> frozenset[str]:
    global _limited
    read_at, names = _limited
    if time.monotonic() - read_at > LIMITED_TTL_SECONDS:
        names = frozenset(SpendLimit.objects.values_list("connector", flat=True).distinct())
        _limited = (time.monotonic(), names)
    return names


def forget_cache() -> None:
    """Read the limits afresh at the next check (after this process changed one)."""
    global _limited
    _limited = (0.0, frozenset())


def over(*, tenant: str, connector: str) -> Over | None:
    """The figures if ``tenant`` has reached its day's limit on ``connector``; None otherwise."""
    if connector not in _limited_connectors():
        return None
    day = today()
    with connection.cursor() as cur:
        cur.execute(
            """SELECT l.per_day, coalesce((SELECT d.spent FROM ledger_spendday d WHERE d.tenant = %(t)s
                                            AND d.connector = %(c)s AND d.day = %(d)s), 0)
               FROM ledger_spendlimit l WHERE l.connector = %(c)s AND l.tenant IN (%(t)s, '*')
               ORDER BY l.tenant = '*' LIMIT 1""",
            {"t": tenant, "c": connector, "d": day},
        )
        row = cur.fetchone()
    if row is None or row[1] < row[0]:
        return None
    return Over(tenant=tenant, connector=connector, day=day, spent=Decimal(row[1]), limit=Decimal(row[0]))


def charge(*, tenant: str, connector: str, amount: float) -> None:
    """Add ``amount`` to today's spend; call in the transaction that journals the cost."""
    if amount <= 0:
        return
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO ledger_spendday (tenant, connector, day, spent) VALUES (%s, %s, %s, %s)
               ON CONFLICT (tenant, connector, day) DO UPDATE SET spent = ledger_spendday.spent + EXCLUDED.spent""",
            [tenant, connector, today(), Decimal(str(amount))],
        )

"""Reads of flow control: each connector's limits and live state, as the connectors page, the
HTTP API and the public API show them; what a held run is waiting for; and the tenants' daily
spend limits with what each has spent today."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from ledger.connectors import get_connector
from ledger.errors import ConnectorNotRegistered
from ledger.flow import spend
from ledger.flow.gate import position_of
from ledger.models import (
    CircuitChange,
    CircuitState,
    ConnectorFlow,
    FlowTicket,
    HoldReason,
    SpendDay,
    SpendLimit,
    TicketState,
)

# The window the latency and error rate are taken over.
STATS_MINUTES = 5
# A circuit's state for the connector as a whole: the worst of its keys'.
_SEVERITY: dict[str, int] = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


@dataclass
class ConnectorState:
    """One connector's flow control as it is now."""

    connector: str
    rate: float | None
    burst: int
    max_in_flight: int | None
    key_field: str
    circuit_failures: int
    circuit_window_seconds: float
    circuit_cooldown_seconds: float
    declared: dict[str, Any]
    changed_by: str
    changed_at: datetime | None
    paused_at: datetime | None
    paused_by: str
    paused_reason: str
    in_flight: int = 0
    waiting: int = 0
    granted: int = 0
    circuit: str = CircuitState.CLOSED
    failures: int = 0
    opened_at: datetime | None = None
    keys_open: int = 0
    ended: int = 0
    failed: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    changes: list[CircuitChange] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def error_rate(self) -> float | None:
        """Share of the calls that ended in the last ``STATS_MINUTES`` that failed for good."""
        return self.failed / self.ended if self.ended else None

    @property
    def limits_changed(self) -> bool:
        return bool(self.changed_by)

    @property
    def state(self) -> str:
        """What a person compares before acting: paused or running."""
        return "paused" if self.paused else "running"

    @property
    def limits(self) -> dict[str, Any]:
        """The limits in force, keyed as ``ledger.flow.services.Limits``."""
        return {"rate": self.rate, "burst": self.burst, "max_in_flight": self.max_in_flight,
                "key_field": self.key_field, "circuit_failures": self.circuit_failures,
                "circuit_window_seconds": self.circuit_window_seconds,
                "circuit_cooldown_seconds": self.circuit_cooldown_seconds}

    @property
    def limits_version(self) -> str:
        """What a person compares before changing the limits (``limits_version``)."""
        return limits_version(self.limits, changed_by=self.changed_by, changed_at=self.changed_at)

    def as_dict(self) -> dict[str, Any]:
        return {
            "connector": self.connector, "state": self.state,
            "limits": {"rate": self.rate, "burst": self.burst, "max_in_flight": self.max_in_flight,
                       "key_field": self.key_field, "circuit_failures": self.circuit_failures,
                       "circuit_window_seconds": self.circuit_window_seconds,
                       "circuit_cooldown_seconds": self.circuit_cooldown_seconds},
            "declared": self.declared, "limits_changed_by": self.changed_by or None,
            "limits_changed_at": self.changed_at.isoformat() if self.changed_at else None,
            "paused": {"at": self.paused_at.isoformat(), "by": self.paused_by, "reason": self.paused_reason}
            if self.paused_at else None,
            "in_flight": self.in_flight, "waiting": self.waiting, "let_go": self.granted,
            "circuit": {"state": self.circuit, "failures": self.failures,
                        "opened_at": self.opened_at.isoformat() if self.opened_at else None,
                        "keys_open": self.keys_open},
            "last_minutes": {"minutes": STATS_MINUTES, "ended": self.ended, "failed": self.failed,
                             "error_rate": self.error_rate, "latency_p50_ms": self.p50_ms,
                             "latency_p95_ms": self.p95_ms},
        }


def limits_version(limits: dict[str, Any], *, changed_by: str, changed_at: datetime | None) -> str:
    """A short fingerprint of a connector's limits and who set them last: it differs after any
    change of the limits (a reset to the declared defaults included), so a form that carries the
    one its page showed can be refused when someone changed them since. Not a secret, not stable
    across versions of this function: compare it only with one made from the same row."""
    seen = json.dumps([limits, changed_by, changed_at.isoformat() if changed_at else None], sort_keys=True)
    return hashlib.sha256(seen.encode()).hexdigest()[:12]


def _deadline(name: str) -> float:
    try:
        return float(get_connector(name).deadline_seconds)
    except ConnectorNotRegistered:
        return 30.0


def connector_states(*, names: list[str] | None = None, changes: int = 0) -> list[ConnectorState]:
    """Every connector with flow control (a row written at a worker's start-up), by name;
    ``changes``: how many of each one's latest circuit changes to attach."""
    flows = ConnectorFlow.objects.order_by("connector")
    if names is not None:
        flows = flows.filter(connector__in=names)
    states = {
        f.connector: ConnectorState(
            connector=f.connector, rate=f.rate, burst=f.burst, max_in_flight=f.max_in_flight, key_field=f.key_field,
            circuit_failures=f.circuit_failures, circuit_window_seconds=f.circuit_window_seconds,
            circuit_cooldown_seconds=f.circuit_cooldown_seconds, declared=f.declared, changed_by=f.changed_by_label,
            changed_at=f.changed_at, paused_at=f.paused_at, paused_by=f.paused_by_label,
            paused_reason=f.paused_reason)
        for f in flows
    }
    if not states:
        return []
    now = timezone.now()
    with connection.cursor() as cur:
        cur.execute(
            """SELECT connector, circuit, failures, opened_at FROM ledger_flowbucket WHERE connector = ANY(%s)""",
            [list(states)])
        for name, circuit, failures, opened_at in cur.fetchall():
            state = states[name]
            if circuit != CircuitState.CLOSED:
                state.keys_open += 1
            worse = _SEVERITY[circuit] > _SEVERITY[state.circuit]
            if worse or (circuit == state.circuit and failures > state.failures):
                state.circuit, state.failures, state.opened_at = circuit, failures, opened_at
        cur.execute(
            """SELECT connector, count(*) FILTER (WHERE state = 'waiting'), count(*) FILTER (WHERE state = 'granted')
               FROM ledger_flowticket WHERE connector = ANY(%s) GROUP BY connector""", [list(states)])
        for name, waiting, granted in cur.fetchall():
            states[name].waiting, states[name].granted = waiting, granted
        for name, state in states.items():
            cur.execute(
                """SELECT count(*) FROM ledger_effectrecord
                   WHERE status = 'IN_PROGRESS' AND connector = %s AND dispatched_at > %s""",
                [name, now - timedelta(seconds=_deadline(name))])
            state.in_flight = int(cur.fetchone()[0])
            cur.execute(
                """SELECT count(*), count(*) FILTER (WHERE status = 'FAILED_FINAL'),
                          percentile_cont(0.5) WITHIN GROUP (ORDER BY completed_at - dispatched_at),
                          percentile_cont(0.95) WITHIN GROUP (ORDER BY completed_at - dispatched_at)
                   FROM ledger_effectrecord
                   WHERE connector = %s AND completed_at > %s AND dispatched_at IS NOT NULL""",
                [name, now - timedelta(minutes=STATS_MINUTES)])
            ended, failed, p50, p95 = cur.fetchone()
            state.ended, state.failed = int(ended), int(failed)
            state.p50_ms = round(p50.total_seconds() * 1000, 1) if p50 is not None else None
            state.p95_ms = round(p95.total_seconds() * 1000, 1) if p95 is not None else None
            if changes:
                state.changes = list(CircuitChange.objects.filter(connector=name).order_by("-at", "-id")[:changes])
    return list(states.values())


def connector_state(name: str, *, changes: int = 20) -> ConnectorState | None:
    found = connector_states(names=[name], changes=changes)
    return found[0] if found else None


@dataclass(frozen=True)
class Waiting:
    """What a held run waits for: ``waiting for payments.capture (rate limit, position 312)``."""

    connector: str
    reason: str
    position: int | None  # None: let go, about to be sent
    step: str

    def describe(self) -> str:
        if self.position is None:
            return f"waiting for {self.connector} (let go, about to be sent)"
        return f"waiting for {self.connector} ({HoldReason(self.reason).label}, position {self.position})"


def run_waiting_for(run_id: UUID | str) -> Waiting | None:
    """The call of ``run_id`` that flow control holds, if any, and its place in the queue now."""
    ticket = FlowTicket.objects.filter(run_id=run_id).select_related("effect").order_by("id").first()
    if ticket is None:
        return None
    position = position_of(ticket) if ticket.state == TicketState.WAITING else None
    return Waiting(connector=ticket.connector, reason=ticket.reason, position=position, step=ticket.effect.step_name)


# --- spend limits -----------------------------------------------------------------------------


def spend_amount(value: Decimal | None) -> str:
    """An amount of usd as people write it and as an ``expected`` carries it: 1, 0.5, 1200 (never
    1.2E+3, never 1.000000); ``"none"`` for no limit."""
    if value is None:
        return "none"
    return format(value.normalize(), "f")


@dataclass(frozen=True)
class TenantSpend:
    """One tenant under an every-tenant (``"*"``) limit: what it spent today and its runs parked."""

    tenant: str
    spent: Decimal
    parked: int
    reached: bool


@dataclass(frozen=True)
class SpendLimitState:
    """A spend limit as it is now (``ledger.models.SpendLimit``), with today's figures (UTC).

    For a tenant's own limit, ``spent`` is that tenant's spend today on the connector and
    ``parked`` its runs parked at the limit. For the every-tenant limit (``tenant == "*"``), each
    tenant counts on its own: ``covered`` lists the tenants it applies to (no limit of their own)
    that spent today or have runs parked, most spent first; ``spent`` is the most any of them
    spent and ``parked`` the sum of their parked runs."""

    tenant: str
    connector: str
    per_day: Decimal
    changed_by: str
    changed_at: datetime
    day: date
    spent: Decimal
    parked: int
    covered: tuple[TenantSpend, ...] = ()

    @property
    def every_tenant(self) -> bool:
        return self.tenant == SpendLimit.EVERY_TENANT

    @property
    def reached(self) -> bool:
        """Whether a call checked now would park its run (``ledger.flow.spend.over``)."""
        return self.spent >= self.per_day

    @property
    def state(self) -> str:
        """What a person compares before changing it (``spend_amount``)."""
        return spend_amount(self.per_day)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant, "connector": self.connector, "per_day": float(self.per_day),
            "day": self.day.isoformat(), "spent_today": float(self.spent), "reached": self.reached,
            "runs_parked": self.parked, "changed_by": self.changed_by or None, "changed_at": self.changed_at,
            "tenants": [{"tenant": t.tenant, "spent_today": float(t.spent), "runs_parked": t.parked,
                         "reached": t.reached} for t in self.covered] if self.every_tenant else None,
        }


def _limit_state(row: SpendLimit, day: date, *, spent: Decimal, parked: int,
                 covered: tuple[TenantSpend, ...] = ()) -> SpendLimitState:
    return SpendLimitState(tenant=row.tenant, connector=row.connector, per_day=row.per_day,
                           changed_by=row.changed_by_label, changed_at=row.changed_at, day=day, spent=spent,
                           parked=parked, covered=covered)


def spend_limits(*, tenants: list[str] | None = None,
                 parked: Mapping[tuple[str, str], int] | None = None) -> list[SpendLimitState]:
    """Every spend limit, by connector then tenant (``"*"`` first), with today's (UTC) spend.

    ``tenants``: only their limits and the every-tenant ones, whose figures then count only
    those tenants (None: every tenant). ``parked``: runs parked at a spend limit per (tenant,
    connector), which the caller counts (the runs are not this package's); a run counts at the
    limit that holds it, the tenant's own, else the every-tenant one. Three queries at most."""
    limits = SpendLimit.objects.all()
    if tenants is not None:
        limits = limits.filter(tenant__in=[*tenants, SpendLimit.EVERY_TENANT])
    rows = sorted(limits, key=lambda r: (r.connector, r.tenant != SpendLimit.EVERY_TENANT, r.tenant))
    if not rows:
        return []
    day = spend.today()
    days = SpendDay.objects.filter(day=day, connector__in={r.connector for r in rows})
    if tenants is not None:
        days = days.filter(tenant__in=tenants)
    spent: dict[tuple[str, str], Decimal] = {(t, c): s for t, c, s in days.values_list("tenant", "connector", "spent")}
    parked = parked or {}
    own = {(r.tenant, r.connector) for r in rows if r.tenant != SpendLimit.EVERY_TENANT}
    found = []
    for row in rows:
        if row.tenant != SpendLimit.EVERY_TENANT:
            key = (row.tenant, row.connector)
            found.append(_limit_state(row, day, spent=spent.get(key, Decimal(0)), parked=parked.get(key, 0)))
            continue
        names = {t for t, c in (*spent, *parked) if c == row.connector and (t, c) not in own}
        if tenants is not None:
            names &= set(tenants)
        covered = sorted(
            (TenantSpend(tenant=t, spent=spent.get((t, row.connector), Decimal(0)),
                         parked=parked.get((t, row.connector), 0),
                         reached=spent.get((t, row.connector), Decimal(0)) >= row.per_day) for t in names),
            key=lambda ts: (-ts.spent, ts.tenant))
        found.append(_limit_state(row, day, spent=max((t.spent for t in covered), default=Decimal(0)),
                                  parked=sum(t.parked for t in covered), covered=tuple(covered)))
    return found

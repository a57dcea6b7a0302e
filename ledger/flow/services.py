"""Writes on a connector's flow control: its declared defaults at start-up, and what staff
change live (pause, resume, limits, tenants' daily spend limits). Each takes the connector's
row lock first, so two people acting at once queue and the second sees the first's change. The
operator actions around them (role, stale-state check, audit entry in the same transaction) are
``operators.services.connectors``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.connectors import Connector, registered_connectors
from ledger.errors import LedgerError
from ledger.flow import gate, spend
from ledger.models import ConnectorFlow, FlowBucket, SpendLimit

# A payload field's name, ASCII (what the HTTP API's schema says too: `key_field`'s pattern).
KEY_FIELD = re.compile(r"[A-Za-z0-9._-]*")
KEY_FIELD_CHARS = 100
MAX_RATE = 1_000_000.0
MAX_COUNT = 1_000_000


class InvalidFlowSetting(LedgerError):
    """A limit that cannot be applied (negative, not a number, too large); nothing was changed."""

    code = "invalid_flow_setting"


class ConnectorPauseState(LedgerError):
    """Pausing a paused connector, or resuming one that is not paused; nothing was changed."""

    code = "connector_pause_state"


@dataclass(frozen=True)
class Limits:
    """A connector's limits as staff set them (None: no such limit)."""

    rate: float | None
    burst: int
    max_in_flight: int | None
    key_field: str
    circuit_failures: int
    circuit_window_seconds: float
    circuit_cooldown_seconds: float

    @classmethod
    def declared_by(cls, connector: type[Connector] | Connector) -> Limits:
        return cls(rate=connector.rate_limit, burst=connector.burst, max_in_flight=connector.max_in_flight,
                   key_field=connector.limit_key, circuit_failures=connector.circuit_failures,
                   circuit_window_seconds=connector.circuit_window_seconds,
                   circuit_cooldown_seconds=connector.circuit_cooldown_seconds).checked()

    @classmethod
    def of(cls, flow: ConnectorFlow) -> Limits:
        return cls(rate=flow.rate, burst=flow.burst, max_in_flight=flow.max_in_flight, key_field=flow.key_field,
                   circuit_failures=flow.circuit_failures, circuit_window_seconds=flow.circuit_window_seconds,
                   circuit_cooldown_seconds=flow.circuit_cooldown_seconds)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def checked(self) -> Limits:
        """Itself, or ``InvalidFlowSetting`` saying which value is wrong and why."""
        def number(name: str, value: Any, *, low: float, high: float, whole: bool) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidFlowSetting(f"{name} must be a number, not {value!r}")
            if whole and int(value) != value:
                raise InvalidFlowSetting(f"{name} must be a whole number, not {value!r}")
            if not low <= value <= high:
                raise InvalidFlowSetting(f"{name} must be between {_number(low)} and {_number(high)}, not {value!r}")

        if self.rate is not None:
            number("rate (calls per second)", self.rate, low=0.001, high=MAX_RATE, whole=False)
        number("burst", self.burst, low=1, high=MAX_COUNT, whole=True)
        if self.max_in_flight is not None:
            number("calls in flight", self.max_in_flight, low=1, high=MAX_COUNT, whole=True)
        number("failures that open the circuit", self.circuit_failures, low=0, high=MAX_COUNT, whole=True)
        number("the circuit's window (seconds)", self.circuit_window_seconds, low=0.1, high=86_400, whole=False)
        number("the circuit's cool-down (seconds)", self.circuit_cooldown_seconds, low=0.1, high=86_400, whole=False)
        key = self.key_field
        if not isinstance(key, str) or len(key) > KEY_FIELD_CHARS or not KEY_FIELD.fullmatch(key):
            raise InvalidFlowSetting(
                f"the limit key must be empty, \"tenant\" or a payload field name (ASCII letters, digits, . _ -; "
                f"at most {KEY_FIELD_CHARS}), not {key!r}")
        return self


def _number(value: float) -> str:
    """1000000 as "1,000,000", 0.001 as "0.001": as a person reads a bound."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,g}"


def sync_declared() -> int:
    """Write each registered connector's declared limits (at a worker's start-up): a connector
    whose limits nobody changed takes them; one that staff changed keeps theirs (its ``declared``
    is updated, so the page can show both). Returns the number of connectors."""
    connectors = registered_connectors()
    for name, conn in connectors.items():
        declared = Limits.declared_by(conn)
        with transaction.atomic():
            flow, created = ConnectorFlow.objects.select_for_update().get_or_create(
                connector=name, defaults={**declared.as_dict(), "declared": declared.as_dict()})
            if created:
                continue
            fields = ["declared"]
            flow.declared = declared.as_dict()
            if not flow.changed_by_label:
                for field, value in declared.as_dict().items():
                    setattr(flow, field, value)
                fields += list(declared.as_dict())
            flow.save(update_fields=fields)
    return len(connectors)


def _locked(connector: str) -> ConnectorFlow:
    flow = ConnectorFlow.objects.select_for_update().filter(connector=connector).first()
    if flow is None:
        raise LookupError(f"no connector named {connector!r} has flow control here")
    return flow


def connector_pause(*, connector: str, by: str, reason: str) -> ConnectorFlow:
    """Hold every call to ``connector``: calls not sent yet wait (their runs suspend, holding no
    worker); calls already out finish. Everything else goes on."""
    with transaction.atomic():
        flow = _locked(connector)
        if flow.paused_at is not None:
            raise ConnectorPauseState(
                f"{connector} is already paused (by {flow.paused_by_label} at {flow.paused_at:%Y-%m-%d %H:%M:%S} UTC)")
        flow.paused_at, flow.paused_by_label, flow.paused_reason = timezone.now(), by, reason
        flow.save(update_fields=["paused_at", "paused_by_label", "paused_reason"])
    return flow


def connector_resume(*, connector: str, by: str, reason: str) -> ConnectorFlow:
    """Lift the pause: the calls that waited go, oldest first, at the connector's rate."""
    with transaction.atomic():
        flow = _locked(connector)
        if flow.paused_at is None:
            raise ConnectorPauseState(f"{connector} is not paused")
        flow.paused_at, flow.paused_by_label, flow.paused_reason = None, "", ""
        flow.save(update_fields=["paused_at", "paused_by_label", "paused_reason"])
    return flow


def connector_limits_set(*, connector: str, by: str, limits: Limits | None) -> ConnectorFlow:
    """Change the limits live (``None``: back to what the connector declares). Every worker
    applies them from its next dispatch; calls already out are not affected."""
    with transaction.atomic():
        flow = _locked(connector)
        if limits is None:
            limits = Limits(**flow.declared) if flow.declared else Limits.of(flow)
            flow.changed_by_label, flow.changed_at = "", None
        else:
            flow.changed_by_label, flow.changed_at = by, timezone.now()
        for field, value in limits.checked().as_dict().items():
            setattr(flow, field, value)
        flow.save()
        if limits.circuit_failures == 0:  # no breaker any more: nothing may stay held by one
            now = timezone.now()
            for key in FlowBucket.objects.filter(connector=connector).exclude(circuit="closed").values_list(
                    "key", flat=True):
                FlowBucket.objects.filter(connector=connector, key=key).update(
                    circuit="closed", trial_effect_id=None, failures=0, changed_at=now)
                gate.circuit_changed(connector, key, "closed", failures=0, at=now,
                                     error=f"circuit breaker turned off by {by}")
    return flow


MAX_SPEND = Decimal("99999999.999999")
SPEND_DECIMALS = 6  # the decimal places SpendLimit.per_day keeps
SPEND_TENANT_CHARS, SPEND_CONNECTOR_CHARS = 100, 200  # as SpendLimit's fields hold them
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # as written; no 1_000


def spend_per_day(value: Any, *, label: str = "the daily spend limit") -> Decimal:
    """``value`` (a number, or its text: ``25``, ``"0.5"``) as a daily spend limit in usd, or
    ``InvalidFlowSetting`` saying what is wrong with ``label``: not a number, negative, over
    ``MAX_SPEND``, or finer than ``SPEND_DECIMALS`` places (it would be rounded, not kept as
    given). Nothing is read or written."""
    amount = Decimal("NaN")
    text = value.strip() if isinstance(value, str) else str(value)
    if not isinstance(value, bool) and _DECIMAL.fullmatch(text):
        try:
            amount = Decimal(text)
        except (InvalidOperation, ValueError):
            pass
    if not amount.is_finite():
        raise InvalidFlowSetting(f"{label} must be a number (such as 25 or 0.5)")
    if not Decimal(0) <= amount <= MAX_SPEND:
        raise InvalidFlowSetting(f"{label} must be between 0 and {MAX_SPEND}")
    amount = amount.normalize() if amount else Decimal(0)
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > SPEND_DECIMALS:
        raise InvalidFlowSetting(f"{label} has at most {SPEND_DECIMALS} decimal places")
    return amount


def spend_names_checked(*, tenant: Any, connector: Any) -> None:
    """``InvalidFlowSetting`` naming the field unless both are names a spend limit can hold: 1 to
    100 (tenant; ``"*"`` for every tenant) or 200 (connector) characters, no spaces around them,
    no NUL character."""
    for label, value, most in (("tenant", tenant, SPEND_TENANT_CHARS), ("connector", connector, SPEND_CONNECTOR_CHARS)):
        if not isinstance(value, str) or not value.strip() or value != value.strip() or len(value) > most \
                or "\x00" in value:
            raise InvalidFlowSetting(f"the {label} must be a name of 1 to {most} characters, without spaces around "
                                     f"it or NUL characters")


def spend_limit_set(*, tenant: str, connector: str, per_day: Any, by: str) -> SpendLimit | None:
    """Set ``tenant``'s daily spend limit on ``connector`` (``"*"``: every tenant without its own);
    ``per_day`` None removes it. Runs parked at the old limit resume once under the new one (the
    sweeper's next pass). ``InvalidFlowSetting``, nothing changed: a name ``spend_names_checked``
    refuses, or an amount ``spend_per_day`` refuses."""
    spend_names_checked(tenant=tenant, connector=connector)
    amount = None if per_day is None else spend_per_day(per_day)
    with transaction.atomic():
        if amount is None:
            SpendLimit.objects.filter(tenant=tenant, connector=connector).delete()
            spend.forget_cache()
            return None
        row, _ = SpendLimit.objects.update_or_create(
            tenant=tenant, connector=connector,
            defaults={"per_day": amount, "changed_by_label": by, "changed_at": timezone.now()})
    spend.forget_cache()
    return row

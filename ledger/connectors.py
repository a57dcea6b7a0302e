"""Connectors: the only way an effect reaches the outside world.

A connector is a class registered with ``@connector(name)``. Its capabilities
decide what recovery may do when the outcome of a dispatch is not known:

=================  ===========================================================
capability         what recovery does with an IN_PROGRESS or UNKNOWN effect
=================  ===========================================================
``lookup(key)``    asks the downstream system; records success, retries on a
                   confirmed "not executed", stays UNKNOWN otherwise
``idempotent``     the downstream system dedupes by key: retry with the same key
neither            UNKNOWN: a person decides, with evidence, in the console
=================  ===========================================================

``compensate(payload, result, *, key)`` undoes a succeeded effect (sagas);
``irreversible = True`` marks effects that cannot be undone (they get an
approval gate unless the workflow opts out).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from ledger.errors import ConnectorAlreadyRegistered, ConnectorNotRegistered
from ledger.outcomes import Outcome


class Connector:
    """Base class of a connector: override ``execute``, and where the downstream allows,
    ``lookup`` and ``compensate``; declare ``idempotent`` / ``irreversible`` truthfully."""

    name: ClassVar[str] = ""
    idempotent: ClassVar[bool] = False
    irreversible: ClassVar[bool] = False
    # Retry policy for ``Retryable`` errors: attempts in all, first back-off,
    # exponential factor, back-off cap, and a deadline from the first dispatch.
    max_attempts: ClassVar[int] = 3
    backoff_seconds: ClassVar[float] = 0.2
    backoff_factor: ClassVar[float] = 2.0
    backoff_max_seconds: ClassVar[float] = 5.0
    deadline_seconds: ClassVar[float] = 30.0
    # Flow control (``ledger.flow``): the defaults of the limits every worker on every host shares
    # for this connector; staff change them live (the console's connectors page, the HTTP API).
    rate_limit: ClassVar[float | None] = None  # calls per second; None: no rate limit
    burst: ClassVar[int] = 1  # calls that may go at once after a quiet spell
    max_in_flight: ClassVar[int | None] = None  # calls out at once; None: no limit
    limit_key: ClassVar[str] = ""  # "": one set of limits; "tenant" or a payload field: one per value
    circuit_failures: ClassVar[int] = 5  # consecutive retryable failures or timeouts that open it; 0: none
    circuit_window_seconds: ClassVar[float] = 60.0  # ... within this many seconds of the first
    circuit_cooldown_seconds: ClassVar[float] = 30.0  # open this long, then one trial call

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        raise NotImplementedError

    # Optional capabilities: a subclass that does not override them lacks them.
    def lookup(self, key: str) -> Outcome:
        raise NotImplementedError

    def compensate(self, payload: dict[str, Any], result: dict[str, Any], *, key: str) -> dict[str, Any]:
        raise NotImplementedError

    # Compensation capabilities, mirroring the forward ones: does the downstream dedupe
    # undo requests by key, and can it tell whether an undo happened?
    compensation_idempotent: ClassVar[bool] = False

    def lookup_compensation(self, key: str) -> Outcome:
        raise NotImplementedError

    @classmethod
    def can_lookup(cls) -> bool:
        return cls.lookup is not Connector.lookup

    @classmethod
    def can_lookup_compensation(cls) -> bool:
        return cls.lookup_compensation is not Connector.lookup_compensation

    @classmethod
    def can_compensate(cls) -> bool:
        return cls.compensate is not Connector.compensate

    def cost(self, payload: dict[str, Any], result: dict[str, Any]) -> float:
        """What a succeeded call cost, in the runs' cost unit (usd): charged to the run's budget
        and to its tenant's daily spend on this connector (``ledger.flow.spend``), once. 0: free."""
        return 0.0

    def manual_result(self, downstream_ref: str) -> dict[str, Any]:
        """The result recorded when a person resolves the effect as succeeded with this
        reference. Override so workflows find the fields they read from a real result."""
        return {"id": downstream_ref, "downstream_ref": downstream_ref, "resolved_manually": True}

    def downstream_ref(self, result: dict[str, Any]) -> str:
        """The downstream system's id for the operation, shown to operators."""
        for field in ("id", "reference", "transaction_id", "message_id", "reservation_id", "shipment_id"):
            if isinstance(result, dict) and result.get(field):
                return str(result[field])
        return ""


class Operation:
    """One kind of call on a connector, as the ledger's recovery rules see it: the forward
    effect, or its compensation. Both go through exactly the same rules."""

    def __init__(self, connector: Connector, kind: str) -> None:
        if kind not in ("effect", "compensation"):
            raise ValueError(kind)
        self.connector, self.kind = connector, kind
        forward = kind == "effect"
        self.can_lookup = connector.can_lookup() if forward else connector.can_lookup_compensation()
        self.idempotent = connector.idempotent if forward else connector.compensation_idempotent
        # A separate PENDING -> IN_PROGRESS commit only where recovery has nothing else to go on.
        self.needs_dispatch_mark = not (self.idempotent or self.can_lookup)
        self.max_attempts = connector.max_attempts
        self.backoff_seconds = connector.backoff_seconds
        self.backoff_factor = connector.backoff_factor
        self.backoff_max_seconds = connector.backoff_max_seconds
        self.deadline_seconds = connector.deadline_seconds

    def execute(self, payload: dict[str, Any], key: str) -> dict[str, Any]:
        if self.kind == "effect":
            return self.connector.execute(payload, key=key)
        return self.connector.compensate(payload["payload"], payload["result"], key=key)

    def lookup(self, key: str) -> Outcome:
        if self.kind == "effect":
            return self.connector.lookup(key)
        return self.connector.lookup_compensation(key)

    def downstream_ref(self, result: dict[str, Any]) -> str:
        return self.connector.downstream_ref(result)

    def cost(self, payload: Any, result: Any) -> float:
        """A forward call's cost (``Connector.cost``); compensations cost nothing here."""
        if self.kind != "effect" or not isinstance(payload, dict) or not isinstance(result, dict):
            return 0.0
        return max(0.0, float(self.connector.cost(payload, result) or 0.0))


_connectors: dict[str, Connector] = {}


_C = TypeVar("_C")


def connector(name: str) -> Callable[[type[_C]], type[_C]]:
    """Class decorator: ``@connector("payments.capture") class Capture(Connector): ...``

    Names are unique in a process: a second class under a name already taken raises
    ``ConnectorAlreadyRegistered`` naming both classes' modules (at start-up, since
    connectors are registered when their modules are imported)."""

    def decorate(cls: type[_C]) -> type[_C]:
        registered: type[Connector]
        if issubclass(cls, Connector):
            registered = cls
        else:  # a class of cls and Connector: still a cls to whoever uses the name
            registered = cast("type[Connector]", type(
                cls.__name__, (cls, Connector), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
            ))
        existing = _connectors.get(name)
        if existing is not None and _where(type(existing)) != _where(registered):
            raise ConnectorAlreadyRegistered(
                f"connector {name!r} is registered twice: by {_where(type(existing))} and by {_where(registered)}; "
                f"give one of them another name"
            )
        registered.name = name
        _connectors[name] = registered()
        return cast("type[_C]", registered)

    return decorate


def _where(cls: type) -> str:
    """Where a connector class is defined; the same class imported again (a module reloaded)
    is the same registration, not a second one."""
    return f"{cls.__module__}.{cls.__qualname__}"


def get_connector(name: str) -> Connector:
    try:
        return _connectors[name]
    except KeyError:
        raise ConnectorNotRegistered(f"no connector named {name!r} is registered") from None


def registered_connectors() -> dict[str, Connector]:
    """Every connector registered in this process, by name."""
    return dict(_connectors)


def autodiscover(extra_modules: list[str]) -> None:
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("connectors")
    for module in extra_modules:
        importlib.import_module(module)

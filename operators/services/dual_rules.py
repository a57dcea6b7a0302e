"""The rules of dual control and the marks on the actions they cover; the frame of every action
(``actions.perform``) asks ``asked_under_rule`` and stores the request. The requests' life
(confirm, refuse, withdraw, expire) is in ``operators.services.dual``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.dispatch import Signal

from operators.models import DualControlRequest

F = TypeVar("F", bound=Callable[..., Any])

# Sent after the commit that created or ended a request (``request``): the console pushes its
# inbox to open pages and notifies (console/apps.py connects it).
dual_changed = Signal()

POLICIES = ("run.compensate", "effect.resolve_unsafe", "run.fork", "run.move", "run.redrive", "run.pause", "bulk")
REASON_CHARS = 4000


class ConfirmationNeeded(Exception):
    """The action waits for a second person (HTTP 202): ``request`` says who, what and until when."""

    def __init__(self, request: DualControlRequest) -> None:
        super().__init__(
            f"{request.summary}: this needs a second person. Request #{request.pk} waits for another operator to "
            f"confirm it before {request.deadline:%Y-%m-%d %H:%M} UTC; nothing was changed yet."
        )
        self.request = request


class DualRefused(Exception):
    """The confirmation, refusal or withdrawal is not possible (HTTP 409, or 403 for the
    requester confirming their own request); the message says why. Audited."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


@dataclass(frozen=True)
class Asked:
    """An action under a dual-control rule, as it was asked: done by ``act(**params)``."""

    policy: str
    act: str
    params: dict[str, Any]
    summary: str


_asked: ContextVar[Asked | None] = ContextVar("dual_asked", default=None)
# Set while a confirmed request's action (or a confirmed batch's items) is done: False, or the
# object as the requester's check found it (a dict; {} for a batch's items: nothing to compare).
_confirming: ContextVar[dict[str, Any] | bool] = ContextVar("dual_confirming", default=False)
_ACTS: dict[str, Callable[..., Any]] = {}


def rules() -> dict[str, Any]:
    """The setting, checked: an unknown rule is an error at the first action, never ignored."""
    configured = getattr(settings, "SAGA_DUAL_CONTROL", {}) or {}
    unknown = sorted(set(configured) - set(POLICIES))
    if unknown:
        raise ImproperlyConfigured(f"SAGA_DUAL_CONTROL: unknown rule(s) {', '.join(unknown)}; the rules are "
                                   f"{', '.join(POLICIES)}")
    for name, tenants in configured.items():
        if not (tenants == "*" or (isinstance(tenants, (list, tuple)) and all(isinstance(t, str) and t
                                                                                for t in tenants))):
            raise ImproperlyConfigured(f'SAGA_DUAL_CONTROL: rule {name} must name "*" (every tenant) or a list of '
                                       f"tenants, not {tenants!r}")
    return dict(configured)


def applies(policy: str, tenant: str) -> bool:
    """Whether the rule ``policy`` covers an object of ``tenant``."""
    rule = rules().get(policy)
    if not rule:
        return False
    tenants = [rule] if isinstance(rule, str) else list(rule)
    return "*" in tenants or tenant in tenants


def bulk_min_items() -> int:
    return int(getattr(settings, "SAGA_DUAL_CONTROL_BULK_ITEMS", 100))


def deadline_after() -> timedelta:
    return timedelta(minutes=float(getattr(settings, "SAGA_DUAL_CONTROL_MINUTES", 60)))


def dual_controlled(policy: Callable[[dict[str, Any]], str | None], summary: Callable[[dict[str, Any]], str]
                    ) -> Callable[[F], F]:
    """Mark an action function (keyword arguments only, JSON-able) as covered by the rule
    ``policy(kwargs)`` names (None: not this time, such as resolving as executed)."""

    def wrap(fn: F) -> F:
        _ACTS[fn.__name__] = fn

        @functools.wraps(fn)
        def inner(actor: Any, **kwargs: Any) -> Any:
            name = policy(kwargs)
            token = _asked.set(Asked(name, fn.__name__, kwargs, summary(kwargs)) if name else None)
            try:
                return fn(actor, **kwargs)
            finally:
                _asked.reset(token)

        return inner  # type: ignore[return-value]

    return wrap


def asked_under_rule(tenant: str) -> Asked | None:
    """For ``perform``: the action being done, when a rule covers it for ``tenant`` and it is not
    the confirmation of a request (which does it)."""
    asked = _asked.get()
    if asked is None or is_confirming() or not applies(asked.policy, tenant):
        return None
    return asked


@contextmanager
def confirming(seen: dict[str, Any] | None = None) -> Iterator[None]:
    """Inside: the actions done are confirmations of a request (no new request); ``seen``: the
    object as it was when the request was made, which ``perform`` finds unchanged or refuses."""
    token = _confirming.set(seen or {})
    try:
        yield
    finally:
        _confirming.reset(token)


def is_confirming() -> bool:
    return _confirming.get() is not False


def seen_at_request() -> dict[str, Any]:
    """While confirming a request: the object as the requester's check found it ({} otherwise)."""
    seen = _confirming.get()
    return seen if isinstance(seen, dict) else {}


def covered(policy: str | None, tenant: str) -> bool:
    """Like ``applies``, for something of several tenants (``tenant`` ""): any tenant the rule names."""
    if not policy:
        return False
    if tenant:
        return applies(policy, tenant)
    return bool(rules().get(policy))


def register_act(fn: F) -> F:
    """Make ``fn`` (keyword arguments, JSON-able) doable by a confirmation, by name."""
    _ACTS[fn.__name__] = fn
    return fn


def act_named(name: str) -> Callable[..., Any]:
    return _ACTS[name]


def changed(request: DualControlRequest) -> None:
    """Tell the console (after the commit) that ``request`` was made or ended."""
    transaction.on_commit(lambda: dual_changed.send(sender=DualControlRequest, request=request), robust=True)

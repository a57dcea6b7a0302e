"""Operator actions on a connector's flow control: pause, resume, and change its limits (each
through ``actions.perform``: role, the connector's row lock, the state the person saw, the change
and its audit entry in one transaction).

A connector serves every tenant, so only someone who sees every tenant may act on it (denied and
audited otherwise), as with a workflow's pause.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.db import transaction

from ledger.flow import services as flow
from ledger.flow.selectors import connector_state, limits_version
from ledger.models import ConnectorFlow
from operators.selectors.tenancy import tenants_of
from operators.services.actions import Actor, Denied, Refused, Target, at_time, audit_denied, perform


def _snapshot(name: str) -> dict[str, Any]:
    flow_row = ConnectorFlow.objects.filter(connector=name).first()
    if flow_row is None:
        return {"state": "unknown"}
    snap: dict[str, Any] = {"state": "paused" if flow_row.paused_at else "running",
                            "limits": flow.Limits.of(flow_row).as_dict()}
    if flow_row.paused_at:
        snap.update(by=flow_row.paused_by_label, reason=flow_row.paused_reason, since=flow_row.paused_at.isoformat())
    return snap


def _target(name: str) -> Target:
    def stale(now: dict[str, Any], seen: str) -> str:
        who = f" by {now['by']}" if now.get("by") else ""
        return (f"{name} is now {now['state']}{who}; it changed since you loaded the page (you saw it {seen}), "
                f"so nothing was changed.")

    def lock() -> None:
        if not ConnectorFlow.objects.select_for_update().filter(connector=name).exists():
            raise Refused(f"no connector named {name!r} has flow control here; nothing was changed")

    return Target("connector", name, lock=lock, snapshot=lambda: _snapshot(name), stale=stale)


def _limits_version_now(name: str) -> str:
    row = ConnectorFlow.objects.filter(connector=name).first()
    if row is None:
        return ""
    return limits_version(flow.Limits.of(row).as_dict(), changed_by=row.changed_by_label, changed_at=row.changed_at)


def _limits_target(name: str) -> Target:
    """The connector, for a change of its limits: ``expected`` is its state, optionally followed
    by the ``limits_version`` the page showed (``"running 3fa2c1d9e0b7"``). With the version, a
    change someone made since (or this very form sent twice) is refused; with the state alone,
    only a pause or resume since is."""
    base = _target(name)

    def same(seen: str, now: str) -> bool:
        state, _, version = seen.partition(" ")
        return state == now and (not version or version == _limits_version_now(name))

    def stale(now: dict[str, Any], seen: str) -> str:
        state = seen.partition(" ")[0]
        if state != now["state"]:
            return base.stale(now, state)
        row = ConnectorFlow.objects.filter(connector=name).first()
        by = f" by {row.changed_by_label}{at_time(row.changed_at)}" if row and row.changed_by_label else \
            " back to the declared defaults"
        return (f"{name}'s limits were changed{by} since you loaded the page, so nothing was changed; "
                f"look at them again and resubmit if yours still apply.")

    return replace(base, same=same, stale=stale)


def _every_tenant(actor: Actor, action: str, name: str, reason: str) -> None:
    if tenants_of(actor.user) is not None:
        with transaction.atomic():
            audit_denied(actor, action, "connector", name, reason=reason)
        raise Denied(f"{actor.label} may not {action.replace('.', ' ')}: a connector serves every tenant, "
                     f"and {actor.label} sees only some")


def connector_pause_act(actor: Actor, *, name: str, reason: str, expected: str | None) -> Any:
    _every_tenant(actor, "connector.pause", name, reason)
    return perform(actor, "connector.pause", _target(name), reason=reason, expected=expected,
                   change=lambda: flow.connector_pause(connector=name, by=actor.label, reason=reason))


def connector_resume_act(actor: Actor, *, name: str, reason: str, expected: str | None) -> Any:
    _every_tenant(actor, "connector.resume", name, reason)
    return perform(actor, "connector.resume", _target(name), reason=reason, expected=expected,
                   change=lambda: flow.connector_resume(connector=name, by=actor.label, reason=reason))


def connector_limits_act(actor: Actor, *, name: str, limits: flow.Limits | None, reason: str,
                         expected: str | None) -> Any:
    """Set the limits (``None``: back to what the connector's class declares). ``expected``: the
    state seen, optionally with the limits' version seen (``_limits_target``)."""
    _every_tenant(actor, "connector.limits", name, reason)
    return perform(actor, "connector.limits", _limits_target(name), reason=reason, expected=expected,
                   change=lambda: flow.connector_limits_set(connector=name, by=actor.label, limits=limits))


__all__ = ["connector_limits_act", "connector_pause_act", "connector_resume_act", "connector_state"]

"""Operator actions on a connector's flow control: pause, resume, and change its limits (each
through ``actions.perform``: role, the connector's row lock, the state the person saw, the change
and its audit entry in one transaction); and set or remove a tenant's daily spend limit on it.

A connector serves every tenant, so only someone who sees every tenant may pause it or change its
limits (denied and audited otherwise), as with a workflow's pause. A spend limit is a tenant's:
an operator may set those of the tenants they see, and only someone who sees every tenant the
every-tenant one (``"*"``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import connection, transaction
from django.db.models import Count

from ledger.flow import services as flow
from ledger.flow.selectors import SpendLimitState, connector_state, limits_version, spend_amount, spend_limits
from ledger.models import ConnectorFlow, SpendLimit
from operators import roles
from operators.selectors.tenancy import scope_runs, tenants_of
from operators.services.actions import (
    Actor,
    Denied,
    Incomplete,
    Refused,
    Target,
    at_time,
    audit_denied,
    perform,
)
from operators.services.tenancy import audit_outside
from sagas.models import RunStatus, WorkflowRun


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


# --- tenants' daily spend limits -------------------------------------------------------------

SPEND_ACTION = "connector.spend_limit"
SPEND_TENANT_CHARS, SPEND_CONNECTOR_CHARS = flow.SPEND_TENANT_CHARS, flow.SPEND_CONNECTOR_CHARS
SPEND_PARKED = "spend_limit"  # the status_reason of a run parked at a spend limit


def spend_limits_seen(user: User | AnonymousUser) -> list[SpendLimitState]:
    """The spend limits ``user`` may see (those of their tenants and the every-tenant ones, whose
    figures then count only their tenants), each with its runs parked at it in those tenants."""
    runs = scope_runs(WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason=SPEND_PARKED),
                      user)
    parked = {(str(row["tenant"]), str(row["error__connector"] or "")): int(row["n"])
              for row in runs.values("tenant", "error__connector").annotate(n=Count("id")).order_by()}
    return spend_limits(tenants=tenants_of(user), parked=parked)


def may_set_spend_limit(user: User | AnonymousUser, tenant: str) -> bool:
    """Whether ``user`` may set ``tenant``'s spend limits: the operator role and ``tenant`` one
    of theirs; the every-tenant limit (``"*"``) only for someone who sees every tenant, since it
    applies to tenants they may not see."""
    if not roles.can(user, SPEND_ACTION):
        return False
    seen = tenants_of(user)
    return seen is None or (tenant != SpendLimit.EVERY_TENANT and tenant in seen)


def spend_whose(tenant: str) -> str:
    """``tenant acme``, or ``every tenant`` for the every-tenant limit, as messages name them."""
    return "every tenant" if tenant == SpendLimit.EVERY_TENANT else f"tenant {tenant}"


def _spend_snapshot(tenant: str, connector: str) -> dict[str, Any]:
    row = SpendLimit.objects.filter(tenant=tenant, connector=connector).first()
    snap: dict[str, Any] = {"state": spend_amount(row.per_day if row else None), "tenant": tenant,
                            "connector": connector}
    if row is not None:
        snap.update(per_day=spend_amount(row.per_day), by=row.changed_by_label, at=row.changed_at.isoformat())
    return snap


def _same_amount(seen: str, now: str) -> bool:
    """Whether the limit the person saw (``1.5``, ``1.50``, ``none``) is the one in force."""
    seen = seen.strip().lower()
    if "none" in (seen, now):
        return seen == now
    try:
        return Decimal(seen) == Decimal(now)
    except (InvalidOperation, ValueError):
        return False


def _clipped(name: str, most: int) -> str:
    """A name as the audit log can hold it (a refused one may be anything)."""
    return name.replace("\x00", "")[:most]


def _spend_target(tenant: str, connector: str) -> Target:
    """A tenant's limit on a connector. The audit entry is about the connector (its id clipped
    to the audit log's 100 characters; the snapshots name both in full) and belongs to the
    limit's tenant (none for the every-tenant limit), so that tenant's people see it in the log.
    ``expected``: the limit's ``per_day`` the person saw, or ``none``."""

    def lock() -> None:
        # The row may not exist yet: a lock on its key, so two people setting it at once queue
        # and the second compares what the first left.
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                        [f"spend_limit\x1f{tenant}\x1f{connector}"])

    def stale(now: dict[str, Any], seen: str) -> str:
        limit = "no daily spend limit" if now["state"] == "none" else f"a daily spend limit of {now['state']} usd"
        by = f" (set by {now['by']}{at_time(datetime.fromisoformat(now['at']))})" if now.get("at") else ""
        return (f"{spend_whose(tenant)} now has {limit} on {connector}{by}; it changed since you loaded the page "
                f"(you saw {seen.strip()[:40] or 'nothing'}), so nothing was changed.")

    owner = "" if tenant == SpendLimit.EVERY_TENANT else _clipped(tenant, SPEND_TENANT_CHARS)
    return Target("connector", _clipped(connector, 100), lock=lock, snapshot=lambda: _spend_snapshot(tenant, connector),
                  stale=stale, same=_same_amount, tenant=owner)


def connector_spend_limit_act(actor: Actor, *, tenant: str, connector: str, per_day: Decimal | None, reason: str,
                              expected: str | None) -> SpendLimit | None:
    """Set ``tenant``'s daily spend limit on ``connector`` to ``per_day`` usd (``None``: remove
    it; ``tenant == "*"``: every tenant without its own), with its audit entry in the same
    transaction (``actions.perform``).

    Refusals, nothing changed: ``Denied`` (403, audited) for a role other than operator, and for
    an operator who does not see ``tenant`` (``may_set_spend_limit``: the every-tenant limit
    needs someone who sees every tenant); ``Incomplete`` (400, not audited, nothing attempted)
    for a name or an amount ``ledger.flow.services`` refuses, or no ``expected``; ``Refused``
    (409, audited) when the limit in force is not the one seen (``expected``: its ``per_day``, or
    ``none``), and for removing a limit that is not there. Runs parked at the old limit resume at
    the sweeper's next pass once their tenant's spend today is under the new one."""
    target = _spend_target(tenant, connector)
    if roles.can(actor.user, SPEND_ACTION):  # anyone else is denied by ``perform`` for their role
        if not may_set_spend_limit(actor.user, tenant):
            with transaction.atomic():
                audit_outside(actor, SPEND_ACTION, target.object_type, target.object_id, tenant=target.tenant or "",
                              reason=reason)
            if tenant == SpendLimit.EVERY_TENANT:
                raise Denied(f"{actor.label} may not set the spend limit for every tenant: it applies to tenants "
                             f"{actor.label} does not see")
            raise Denied(f"{actor.label} may set only the spend limits of their own tenants")
        try:
            flow.spend_names_checked(tenant=tenant, connector=connector)
            if per_day is not None:
                flow.spend_per_day(per_day)
        except flow.InvalidFlowSetting as exc:
            raise Incomplete(f"{str(exc)[:1].upper()}{str(exc)[1:]}; nothing was changed.") from exc

    def change() -> SpendLimit | None:
        if per_day is None and not SpendLimit.objects.filter(tenant=tenant, connector=connector).exists():
            raise Refused(f"{spend_whose(tenant)} has no daily spend limit on {connector} to remove; "
                          f"nothing was changed.")
        return flow.spend_limit_set(tenant=tenant, connector=connector, per_day=per_day, by=actor.label)

    result: SpendLimit | None = perform(actor, SPEND_ACTION, target, reason=reason, expected=expected, change=change)
    return result


__all__ = ["connector_limits_act", "connector_pause_act", "connector_resume_act", "connector_spend_limit_act",
           "connector_state", "may_set_spend_limit", "spend_limits_seen"]

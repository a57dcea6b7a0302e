"""The connectors page (live region ``connectors_list``): each connector's flow control as it is
now (limits, pause, calls in flight, waiting and let go, circuit breaker, the last minutes'
error rate and latency) and, per connector, the circuit's recent changes and the operator's
forms: pause, resume, change the limits, back to the declared defaults.

Live twice over, like the workers page: the region follows the ``connectors`` topic (a circuit
that opens, goes half-open or closes; an operator's change from here or the HTTP API), and
polls itself every 5 s (htmx ``every 5s``) for its counts: a call held, let go, sent or answered
publishes nothing to it (under load they change every few milliseconds). Both morph the region
(console/static/console/live_morph.js), so a form someone is filling in stays as it is, its
``expected`` included: if the connector changed meanwhile, the action is refused (409) rather
than applied to something the person did not see.

Actions are POSTs with CSRF through ``operators.services.connectors`` (role, the connector's
row lock, the state seen, the change and its audit entry in one transaction): 403 denied, 409
refused (stale page, double submit, someone faster), 400 a value the form cannot take (nothing
attempted). The forms post through htmx, whose CSRF header comes from the page (a push renders
the forms without the request, so without a token field of their own): the answer is the region
as it is now and the result as a message out of band. Without JavaScript they post as plain
forms, answered with a redirect and a message, or the page with the refusal.

Above the connectors, the tenants' daily spend limits (region ``connectors_spend``): per limit
the tenant, connector, limit, today's (UTC) spend, the runs parked at it and who set it, with a
form to set, raise or remove one. A spend limit is a tenant's, so an operator of some tenants
gets the forms for theirs (the server checks it again). The region polls itself every 5 s (spend
grows with every priced call; it follows no topic), and its form posts to the page's own URL.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import ActionForm
from console.forms_connectors import ConnectorLimitsForm, ConnectorPauseForm, SpendLimitForm
from console.views.base import (
    ConsoleRequest,
    action_input,
    action_view,
    actor_of,
    bad_request,
    live_context,
    viewer_required,
)
from console.views.notices import message_oob
from ledger.flow import spend
from ledger.flow.selectors import STATS_MINUTES, ConnectorState, SpendLimitState, TenantSpend, connector_states
from ledger.models import CircuitChange, CircuitState, ConnectorFlow
from operators import roles
from operators.selectors.tenancy import tenants_of
from operators.services.actions import Denied, Incomplete, Refused
from operators.services.connectors import (
    SPEND_ACTION,
    connector_limits_act,
    connector_pause_act,
    connector_resume_act,
    connector_spend_limit_act,
    may_set_spend_limit,
    spend_limits_seen,
    spend_whose,
)

CONNECTORS_FRAGMENT = "connectors_list"
SPEND_PART = "spend"  # ?part=spend: the spend limits' region, for its own poll
SPEND_ANCHOR = "spend-limits"
COVERED_SHOWN = 10  # tenants listed under an every-tenant limit
CHANGES_SHOWN = 10  # circuit changes per connector in its timeline
_NOT_ID = re.compile(r"[^A-Za-z0-9_-]+")


def _num(value: float | int) -> str:
    """A number as people write it: 0.5, 1200 (never 1.2E+3, never 5.0)."""
    return format(Decimal(str(value)).normalize(), "f")


def limits_text(limits: dict[str, Any]) -> str:
    """One line for a set of limits (``Limits.as_dict`` keys), as the page shows the declared ones."""
    if not limits:
        return "none recorded"
    rate = limits.get("rate")
    parts = [f"{_num(rate)} calls/s, burst {limits.get('burst')}" if rate is not None else "no rate limit"]
    in_flight = limits.get("max_in_flight")
    parts.append(f"at most {in_flight} in flight" if in_flight is not None else "no in-flight limit")
    parts.append(_key_text(str(limits.get("key_field") or "")))
    failures = limits.get("circuit_failures") or 0
    window = _num(limits.get("circuit_window_seconds") or 0)
    cooldown = _num(limits.get("circuit_cooldown_seconds") or 0)
    parts.append(f"circuit opens after {failures} failures in {window} s, cool-down {cooldown} s" if failures
                 else "no circuit breaker")
    return " · ".join(parts)


def _key_text(key_field: str) -> str:
    if not key_field:
        return "one set for the whole connector"
    if key_field == "tenant":
        return "kept per tenant"
    return f"kept per payload field {key_field}"


def connector_anchor(name: str) -> str:
    """The id of a connector's section (its name may hold any character)."""
    return "connector-" + _NOT_ID.sub("-", name).strip("-")[:80]


@dataclass(frozen=True)
class ConnectorRow:
    """A connector as the page shows it: its state and what the template cannot work out itself."""

    s: ConnectorState
    anchor: str
    circuit_since: datetime | None  # when the circuit took its state (open: when it opened)
    circuit_label: str
    error_rate: str
    key_text: str
    declared_text: str
    current_text: str
    rate: str
    window: str
    cooldown: str

    @property
    def changes(self) -> list[CircuitChange]:
        return self.s.changes


def _row(state: ConnectorState) -> ConnectorRow:
    since = state.opened_at if state.circuit != CircuitState.CLOSED else None
    if since is None and state.changes and state.changes[0].state == CircuitState.CLOSED:
        since = state.changes[0].at
    return ConnectorRow(
        s=state, anchor=connector_anchor(state.connector),
        circuit_since=since, circuit_label=str(state.circuit).replace("_", "-"),
        error_rate=f"{state.error_rate * 100:.1f} %" if state.error_rate is not None else "–",
        key_text=_key_text(state.key_field), declared_text=limits_text(state.declared),
        current_text=limits_text(state.limits),
        rate=_num(state.rate) if state.rate is not None else "", window=_num(state.circuit_window_seconds),
        cooldown=_num(state.circuit_cooldown_seconds),
    )


def _may_act(user: User) -> bool:
    """A connector serves every tenant: its forms are for operators who see every tenant."""
    return tenants_of(user) is None and any(
        roles.can(user, action) for action in ("connector.pause", "connector.resume", "connector.limits"))


def _connectors_context(user: User, params: dict[str, str]) -> dict[str, Any]:
    return {
        "rows": [_row(s) for s in connector_states(changes=CHANGES_SHOWN)],
        "may_act": _may_act(user),
        "minutes": STATS_MINUTES,
    }


def connectors_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/connectors_live.html", _connectors_context(user, params))


def _page(request: ConsoleRequest, *, status: int = 200) -> HttpResponse:
    context = {**_connectors_context(request.user, {}), **_spend_context(request.user)}
    context.update(live_context([CONNECTORS_FRAGMENT]))
    return render(request, "console/connectors.html", context, status=status)


@require_http_methods(["GET", "POST"])
def connectors(request: ConsoleRequest) -> HttpResponseBase:
    """The page (GET), and its spend-limit form (POST: ``connector_spend_limit``)."""
    if request.method == "POST":
        return connector_spend_limit(request)
    return _connectors_get(request)


@viewer_required
def _connectors_get(request: ConsoleRequest) -> HttpResponse:
    if request.htmx:  # a region's own poll
        if request.GET.get("part") == SPEND_PART:
            return HttpResponse(spend_fragment(request.user))
        return HttpResponse(connectors_fragment(request.user, {}))
    return _page(request)


def _answer(request: ConsoleRequest, *, status: int = 200, error: str = "", notice: str = "",
            spend: bool = False) -> HttpResponse:
    """For htmx: the region as it is now (the connectors', or with ``spend`` the spend limits')
    and the result as a message (out of band). Without JavaScript: the page again with the
    message (an error), or back to the page at the region (done)."""
    if request.htmx:
        if spend:
            html = spend_fragment(request.user, request=request)
        else:
            html = render_to_string("console/connectors_live.html", _connectors_context(request.user, {}),
                                    request=request)
        return HttpResponse(html + message_oob(error=error, notice=notice), status=status)
    if status >= 400:
        if status == 400:
            return bad_request(request, error, title="Nothing was changed")
        if status == 403:
            raise PermissionDenied(error)
        messages.error(request, error)
        return _page(request, status=status)
    messages.success(request, notice)
    anchor = SPEND_ANCHOR if spend else connector_anchor(str(request.POST.get("connector", "")))
    return redirect(f"{reverse('console:connectors')}#{anchor}")


def _connector_action(request: ConsoleRequest, action: str, form_class: type[ActionForm],
                      act: Callable[[dict[str, Any]], Any], done: Callable[[str], str]) -> HttpResponse:
    """Validate the form (400 naming the field for someone allowed to act; anyone else goes on to
    the service, which denies and audits them), call the operator action, answer with the result:
    403 denied, 409 refused (stale, someone faster), 400 incomplete."""
    fields, problem = action_input(request, form_class, action)
    if problem:
        return _answer(request, status=400, error=problem)
    try:
        act(fields)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        return _answer(request, status=status, error=str(exc))
    return _answer(request, notice=done(str(fields.get("connector") or "")))


def _actor_args(request: ConsoleRequest, fields: dict[str, Any]) -> dict[str, Any]:
    return {"name": str(fields.get("connector") or ""), "reason": str(fields.get("reason") or ""),
            "expected": str(fields.get("expected") or "") or None}


@require_POST
@action_view("connector.pause", "connector", id_kwarg="connector")
def connector_pause(request: ConsoleRequest) -> HttpResponse:
    return _connector_action(
        request, "connector.pause", ConnectorPauseForm,
        lambda f: connector_pause_act(actor_of(request), **_actor_args(request, f)),
        lambda name: f"{name} paused: its calls not sent yet wait (their runs suspend, holding no worker) until "
                     f"it is resumed; calls already out finish.")


@require_POST
@action_view("connector.resume", "connector", id_kwarg="connector")
def connector_resume(request: ConsoleRequest) -> HttpResponse:
    return _connector_action(
        request, "connector.resume", ConnectorPauseForm,
        lambda f: connector_resume_act(actor_of(request), **_actor_args(request, f)),
        lambda name: f"{name} resumed: the calls that waited go, oldest first, at its rate.")


@require_POST
@action_view("connector.limits", "connector", id_kwarg="connector")
def connector_limits(request: ConsoleRequest) -> HttpResponse:
    def act(fields: dict[str, Any]) -> Any:
        # ``limits`` is None for "back to declared", and for someone the service will deny (their
        # form is not validated: nothing of it is applied).
        return connector_limits_act(actor_of(request), limits=fields.get("limits"), **_actor_args(request, fields))

    def done(name: str) -> str:
        if request.POST.get("declared"):
            return f"{name} is back to the limits its code declares; every worker applies them from its next call."
        return f"{name}'s limits changed; every worker applies them from its next call (calls already out are " \
               f"not affected)."

    return _connector_action(request, "connector.limits", ConnectorLimitsForm, act, done)


# --- tenants' daily spend limits ----------------------------------------------------------------


def usd(value: Decimal) -> str:
    """An amount of usd for the page: 25.00, 1.20, 0.0004 (cents at least, finer when it is)."""
    text = format(value.normalize() if value else Decimal(0), "f")
    whole, _, cents = text.partition(".")
    return f"{whole}.{cents.ljust(2, '0')}"


@dataclass(frozen=True)
class SpendRow:
    """A spend limit as the page shows it."""

    s: SpendLimitState
    anchor: str  # the id its forms hang from (names may hold any character)
    per_day: str
    spent: str
    covered: tuple[tuple[TenantSpend, str], ...]  # an every-tenant limit's first tenants, each with its spend
    covered_more: int
    may_change: bool


def spend_anchor(tenant: str, connector: str) -> str:
    """A limit's id: readable, and unique whatever the names hold (two names that read the same
    once cleaned differ by the hash)."""
    readable = _NOT_ID.sub("-", f"{connector}-{tenant}").strip("-")[:60]
    digest = hashlib.sha256(f"{tenant}\x1f{connector}".encode()).hexdigest()[:8]
    return f"spend-{readable}-{digest}"


def _spend_row(state: SpendLimitState, *, may_change: bool) -> SpendRow:
    shown = state.covered[:COVERED_SHOWN]
    return SpendRow(s=state, anchor=spend_anchor(state.tenant, state.connector), per_day=usd(state.per_day),
                    spent=usd(state.spent), covered=tuple((t, usd(t.spent)) for t in shown),
                    covered_more=len(state.covered) - len(shown), may_change=may_change)


def _spend_context(user: User) -> dict[str, Any]:
    tenants = tenants_of(user)
    may_set = roles.can(user, SPEND_ACTION) and tenants != []
    rows = [_spend_row(s, may_change=may_set_spend_limit(user, s.tenant)) for s in spend_limits_seen(user)]
    known = sorted({*ConnectorFlow.objects.values_list("connector", flat=True), spend.MODEL}) if may_set else []
    return {"spend_rows": rows, "may_set_spend": may_set, "spend_tenants": tenants, "spend_connectors": known,
            "spend_day": spend.today()}


def spend_fragment(user: User, *, request: ConsoleRequest | None = None) -> str:
    return render_to_string("console/connectors_spend.html", _spend_context(user), request=request)


@action_view(SPEND_ACTION, "connector", id_kwarg="connector")
def connector_spend_limit(request: ConsoleRequest) -> HttpResponse:
    """Set, raise, lower or remove a tenant's daily spend limit (``SpendLimitForm``): 400 naming
    the field for an amount that cannot be one (nothing attempted), 403 denied (the role, or a
    tenant the operator does not see; audited), 409 refused (the limit is not the one the page
    showed; audited)."""
    fields, problem = action_input(request, SpendLimitForm, SPEND_ACTION)
    if problem:
        return _answer(request, status=400, error=problem, spend=True)
    tenant, connector = str(fields.get("tenant") or ""), str(fields.get("connector") or "")
    try:
        connector_spend_limit_act(actor_of(request), tenant=tenant, connector=connector,
                                  per_day=fields.get("amount"), reason=str(fields.get("reason") or ""),
                                  expected=str(fields.get("expected") or "") or None)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        return _answer(request, status=status, error=str(exc), spend=True)
    whose = spend_whose(tenant)
    if fields.get("amount") is None:
        notice = f"{whose} has no daily spend limit on {connector} any more; runs parked at it resume at the " \
                 f"sweeper's next pass."
    else:
        notice = f"{whose}'s daily spend limit on {connector} is now {usd(fields['amount'])} usd; runs parked at " \
                 f"it resume at the sweeper's next pass once their tenant's spend today is under it."
    return _answer(request, notice=notice, spend=True)

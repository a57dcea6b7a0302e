"""The queues people work through: ambiguous effects and the approvals inbox.

Each page is a live region (``console.live``): the page, the htmx swap after an action and the
websocket push all render the same ``<page>_live.html`` fragment. Actions are POSTs that go
through ``operators.services`` (role check, stale-state check, audit entry): a denied action answers
403 and a refused one 409, each with the page and the reason; a successful one redirects back
with a message, or returns the re-rendered fragment to htmx.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET, require_POST

from console.forms import ApprovalDecideForm, EffectResolveForm
from console.forms_queues import EffectFilterForm
from console.rowlinks import action_target, pick_label, url_maker
from console.selectors.decisions import effects_to_undo
from console.views.base import (
    ConsoleRequest,
    action_input,
    action_view,
    actor_of,
    get_approval_for_user,
    get_effect_for_user,
    live_context,
    viewer_required,
)
from console.views.notices import message_oob, page_messages
from ledger.models import EffectRecord
from operators import roles
from operators.models import DualControlRequest
from operators.selectors.paging import BadCursor, Cursor, Page, decode_cursor
from operators.selectors.queues import (
    approval_current_decision,
    approvals_inbox,
    approvals_recently_decided,
    effect_connectors,
    effect_current_outcome,
    effects_ambiguous_page,
)
from operators.selectors.runs import workflow_names
from operators.services.actions import Denied, Incomplete, Refused
from operators.services.dual import DualRefused, dual_confirm, dual_open, dual_refuse, dual_withdraw, person_of
from operators.services.dual_rules import ConfirmationNeeded
from operators.services.queues import approval_act, effect_manual_resolve
from operators.services.queues import effect_query as effect_query_service
from sagas.models import ApprovalRequest, ApprovalState, WorkflowRun

EFFECTS_FRAGMENT = "effects_queue"
APPROVALS_FRAGMENT = "approvals_inbox"

RESOLVE_OUTCOMES = [
    ("succeeded", "succeeded: the provider did it (give its reference)"),
    ("not_executed", "not executed: the provider never did it (retried with the same key)"),
    ("failed", "failed: it did not happen and must not be retried"),
]
QUERY_ANSWERS = {
    "Succeeded": "Succeeded. The effect is recorded as succeeded and its run continues.",
    "NotExecuted": "NotExecuted: the provider has no record of this key. It will be retried with the same key.",
    "Unknown": "Unknown: the provider could not say. The effect stays in this queue.",
}


def _act(
    request: ConsoleRequest,
    action: Callable[[], Any],
    *,
    success: Callable[[Any], str],
    refused_detail: Callable[[], str],
    rerender: Callable[..., HttpResponse],
    back_to: str,
) -> HttpResponse:
    """Run an audited action and answer: 403 (Denied), 400 (Incomplete: the form did not say
    what the person saw) or 409 (Refused) with the page and the reason; on success a redirect
    with a message, or the fragment for htmx."""
    try:
        result = action()
    except ConfirmationNeeded as exc:  # dual control: stored for a second person, nothing done yet
        if request.htmx:
            return rerender(request, status=202, notice=str(exc))
        messages.info(request, str(exc))
        return redirect(back_to)
    except Denied as exc:
        return rerender(request, status=403, error=str(exc))
    except Incomplete as exc:
        return rerender(request, status=400, error=str(exc))
    except Refused as exc:
        message = str(exc)
        detail = "" if exc.states_now else refused_detail()
        if detail and detail not in message:
            message = f"{message}; {detail}"
        return rerender(request, status=409, error=message)
    text = success(result)
    if request.htmx:
        return rerender(request, notice=text)
    messages.success(request, text)
    return redirect(back_to)


def _respond(
    request: ConsoleRequest, *, page: str, fragment_template: str, context: dict[str, Any], live: dict[str, Any],
    status: int,
) -> HttpResponse:
    """The page, or for htmx its live region; the context's ``error`` and ``notice`` are messages
    outside the region (console/views/notices.py), so the next push does not take them away."""
    error, notice = context.pop("error", ""), context.pop("notice", "")
    if request.htmx and request.method == "POST":
        html = render_to_string(fragment_template, context, request=request)
        return HttpResponse(html + message_oob(error=error, notice=notice), status=status)
    page_messages(request, error=error, notice=notice)
    context.update(live)
    return render(request, page, context, status=status)


# --- ambiguous effects ---------------------------------------------------------------------------


class _Shown:
    """A row as the template shows it: the row's own attributes, and what ``console.rowlinks``
    computes once for it (its URLs, its actions' hidden target text)."""

    def __init__(self, row: Any, **shown: Any) -> None:
        self._row = row
        self.__dict__.update(shown)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


def _effect_rows(page: Any) -> list[_Shown]:
    request, error = (url_maker("console:run_item_payload", run=True, kind=kind)
                      for kind in ("effect-request", "effect-error"))
    query, resolve = url_maker("console:effect_query"), url_maker("console:effect_resolve")
    rows = []
    now = timezone.now()
    for row in page.items:
        e = row.effect
        key = row.run.business_key if row.run else ""
        rows.append(_Shown(
            row, request_url=request(run_id=e.run_id, item_id=e.id), error_url=error(run_id=e.run_id, item_id=e.id),
            query_url=query(item_id=e.id), resolve_url=resolve(item_id=e.id),
            target=action_target(run_id=e.run_id, key=key, step=e.step_name, effect_id=e.id),
            short=str(e.run_id)[:8], pick=pick_label("effect", f"#{e.id}", step=e.step_name, run_id=e.run_id, key=key),
            unknown_for=timesince(row.unknown_since, now),
        ))
    return rows


def _effects_context(user: User, form: EffectFilterForm) -> dict[str, Any]:
    """The queue's page at ``form``'s filters and cursor (the first page if the cursor is not
    valid); no page at all while a filter is not valid (the form says why)."""
    found = (effects_ambiguous_page(user=user, filters=form.filters(), cursor=form.cursor)
             if form.filters_valid else None)
    page = Page(items=_effect_rows(found), next=found.next, total=found.total) if found is not None else None
    base = reverse("console:effects")
    filtered = form.filter_query
    return {
        "query": form,
        "page": page,
        "cursor": form.cursor_text,
        "filter_query": filtered,
        "filtered": bool(filtered),
        "first_url": f"{base}?{filtered}" if filtered else base,
        "next_url": (f"{base}?{urlencode(form.link_params(after=page.next_cursor))}"
                     if page and page.next_cursor else ""),
        "can_query": roles.can(user, "effect.query"),
        "can_resolve": roles.can(user, "effect.resolve"),
        "outcomes": RESOLVE_OUTCOMES,
    }


def effects_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/effects_live.html", _effects_context(user, EffectFilterForm(params)))


def _effects_form(request: ConsoleRequest) -> EffectFilterForm:
    """After an action, the page it came from (the filters and cursor its form carried); else the query string."""
    if request.method == "POST":
        return EffectFilterForm.carried(request.POST.get("filters", ""), after=request.POST.get("after", ""))
    return EffectFilterForm(request.GET)


def _effects_page(request: ConsoleRequest, *, status: int = 200, error: str = "", notice: str = "") -> HttpResponse:
    form = _effects_form(request)
    if request.method == "GET" and not form.is_valid():  # a bad filter or a damaged page link (400)
        status, error = 400, ""
    context = _effects_context(request.user, form)
    context.update(error=error, notice=notice)
    if request.method == "GET":
        context.update(connectors=_with(effect_connectors(user=request.user), form.values["connector"]),
                       workflow_names=workflow_names())
    return _respond(request, page="console/effects.html", fragment_template="console/effects_live.html",
                    context=context, live=live_context([EFFECTS_FRAGMENT], **form.link_params(after=form.cursor_text)),
                    status=status)


def _with(options: list[str], current: str) -> list[str]:
    """``options``, plus the value asked for if it is not one of them (it still shows as chosen)."""
    return options if not current or current in options else sorted([*options, current])


@require_GET
@viewer_required
def effects(request: ConsoleRequest) -> HttpResponse:
    return _effects_page(request)


def _effects_url(request: ConsoleRequest) -> str:
    """The queue's page the action was taken on: its filters and cursor (the first page if the
    cursor is not valid)."""
    url = reverse("console:effects")
    form = _effects_form(request)
    params = form.link_params(after=form.cursor_text)
    return f"{url}?{urlencode(params)}" if params else url


@require_POST
@action_view("effect.query", "effect", id_kwarg="effect_id", text="")
def effect_query(request: ConsoleRequest, effect_id: int) -> HttpResponse:
    effect = get_effect_for_user(request, effect_id, action="effect.query")

    def said(answer: str) -> str:
        return f"Provider lookup for effect #{effect.id} ({effect.step_name}): {QUERY_ANSWERS.get(answer, answer)}"

    return _act(
        request, lambda: effect_query_service(actor_of(request), effect_id=effect.id),
        success=said, refused_detail=lambda: effect_current_outcome(effect.id),
        rerender=_effects_page, back_to=_effects_url(request),
    )


@require_POST
@action_view("effect.resolve", "effect", id_kwarg="effect_id", text="note")
def effect_resolve(request: ConsoleRequest, effect_id: int) -> HttpResponse:
    effect = get_effect_for_user(request, effect_id, action="effect.resolve")
    fields, problem = action_input(request, EffectResolveForm, "effect.resolve")
    if problem:
        return _effects_page(request, status=400, error=problem)
    outcome, downstream_ref, note = fields["outcome"], fields["downstream_ref"].strip(), fields["note"]

    def done(resolved: EffectRecord) -> str:
        ref = f", reference {downstream_ref}" if outcome == "succeeded" else ""
        return f"Effect #{resolved.id} ({resolved.step_name}) resolved as {outcome}{ref}; its run is woken."

    return _act(
        request,
        lambda: effect_manual_resolve(
            actor_of(request), effect_id=effect.id, outcome=outcome, downstream_ref=downstream_ref, note=note,
            expected=fields["expected"] or None,
        ),
        success=done, refused_detail=lambda: effect_current_outcome(effect.id),
        rerender=_effects_page, back_to=_effects_url(request),
    )


# --- approvals inbox -----------------------------------------------------------------------------


def _span(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def remaining_text(deadline: datetime, now: datetime) -> str:
    """Same wording as console/static/console/countdown.js, which takes over in the browser."""
    seconds = int((deadline - now).total_seconds())
    return f"{_span(seconds)} left" if seconds >= 0 else f"overdue by {_span(-seconds)}"


def undo_said(effects: int) -> str:
    """What rejecting a run with ``effects`` completed effects undoes, for the reject form."""
    if not effects:
        return "it has completed no effect yet, so there is nothing to undo now"
    if effects == 1:
        return "the 1 effect it has completed is undone, newest first, where it can be"
    return f"the {effects} effects it has completed are undone, newest first, where they can be"


def _inbox_cursor(text: str) -> Cursor | None:
    """The page cursor an inbox link or form carried; None (the first page) for none."""
    return decode_cursor(text, key=int) if text else None


def _approvals_context(user: User, after: str = "") -> dict[str, Any]:
    """The inbox's page after the cursor ``after`` (the first page if it is not valid: a live
    push or an action's answer never fails on a damaged cursor; a GET says so, see below)."""
    now = timezone.now()
    try:
        cursor = _inbox_cursor(after)
    except BadCursor:
        cursor, after = None, ""
    page = approvals_inbox(user=user, cursor=cursor)
    items = page.items
    to_undo = effects_to_undo({a.run_id for a in items}) if roles.can(user, "approval.reject") else {}
    reason_url = url_maker("console:run_item_payload", run=True, kind="approval-reason")
    decide_url = url_maker("console:approval_decide")
    rows = [
        {
            "a": a,
            "reason_url": reason_url(run_id=a.run_id, item_id=a.id),
            "decide_url": decide_url(item_id=a.id),
            "target": action_target(run_id=a.run_id, key=a.run.business_key, step=a.step),
            "remaining": remaining_text(a.deadline, now),
            "overdue": a.deadline <= now,
            "escalated": a.state == ApprovalState.ESCALATED,
            "own_run": a.run.started_by_id is not None and a.run.started_by_id == user.pk,
            "undo_said": undo_said(to_undo.get(str(a.run_id), 0)),  # what a rejection compensates
            "short": str(a.run_id)[:8],
            "pick": pick_label("approval", a.id, step=a.step, run_id=a.run_id, key=a.run.business_key),
            "requested_ago": timesince(a.requested_at, now),
        }
        for a in items
    ]
    base = reverse("console:approvals")
    return {
        "rows": rows,
        "total": page.total,
        "cursor": after,
        "first_url": base,
        "next_url": f"{base}?{urlencode({'after': page.next_cursor})}" if page.next_cursor else "",
        "recent": approvals_recently_decided(user=user),
        "dual": _dual_rows(user, now),
        "can_approve": roles.can(user, "approval.approve"),
        "can_reject": roles.can(user, "approval.reject"),
    }


def approvals_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/approvals_live.html", _approvals_context(user, params.get("after", "")))


def _approvals_page(request: ConsoleRequest, *, status: int = 200, error: str = "", notice: str = "") -> HttpResponse:
    after = (request.POST if request.method == "POST" else request.GET).get("after", "")
    if request.method == "GET" and after:
        try:
            _inbox_cursor(after)
        except BadCursor:  # a damaged page link: the first page, and why (400)
            status = 400
            error = "That page link is not valid (its position in the inbox is damaged): showing the soonest deadlines."
    context = _approvals_context(request.user, after)
    context.update(error=error, notice=notice)
    return _respond(request, page="console/approvals.html", fragment_template="console/approvals_live.html",
                    context=context, live=live_context([APPROVALS_FRAGMENT], after=context["cursor"]), status=status)


def _approvals_url(request: ConsoleRequest) -> str:
    """The inbox's page the decision was taken on (the cursor its form carried)."""
    after = request.POST.get("after", "")
    try:
        _inbox_cursor(after)
    except BadCursor:
        after = ""
    url = reverse("console:approvals")
    return f"{url}?{urlencode({'after': after})}" if after else url


@require_GET
@viewer_required
def approvals(request: ConsoleRequest) -> HttpResponse:
    return _approvals_page(request)


def _dual_rows(user: User, now: Any) -> list[dict[str, Any]]:
    """The requests waiting for a second person (dual control), soonest deadline first."""
    me = person_of(user)
    return [
        {"r": r, "remaining": remaining_text(r.deadline, now), "own": r.requested_by_id == user.pk,
         "may_decide": r.requested_by_id != user.pk and person_of(r.requested_by) != me and roles.can(user, r.action)}
        for r in dual_open(user).select_related("requested_by")[:DUAL_SHOWN]
    ]


DUAL_SHOWN = 100
DUAL_REASON_CHARS = 4000
DUAL_VERBS = {"confirm": (dual_confirm, "Confirmed request #{id}: {summary}, done."),
              "refuse": (dual_refuse, "Refused request #{id}: nothing was done."),
              "withdraw": (dual_withdraw, "Withdrew request #{id}: nothing was done.")}


def _dual_decide(request: ConsoleRequest, request_id: int, verb: str) -> HttpResponse:
    """Confirm, refuse or withdraw a request; the service checks who may (the role of its action,
    not the requester for confirm and refuse, only the requester to withdraw) and audits it."""
    do, said = DUAL_VERBS[verb]
    reason = str(request.POST.get("reason", "")).strip()
    if "\x00" in reason or len(reason) > DUAL_REASON_CHARS:
        return _approvals_page(request, status=400, error=f"The reason must be at most {DUAL_REASON_CHARS} characters "
                                                           f"of text. Nothing was changed.")
    try:
        done = do(actor_of(request), request_id=request_id, reason=reason)
    except DualRefused as exc:
        return _approvals_page(request, status=403 if exc.forbidden else 409, error=str(exc))
    except Denied as exc:
        return _approvals_page(request, status=403, error=str(exc))
    except Incomplete as exc:
        return _approvals_page(request, status=400, error=str(exc))
    except Refused as exc:
        return _approvals_page(request, status=409, error=str(exc))
    decided = DualControlRequest.objects.get(pk=request_id)
    text = said.format(id=decided.pk, summary=decided.summary)
    if verb == "confirm" and isinstance(done, WorkflowRun) and str(done.id) != decided.object_id:
        text += f" New run {str(done.id)[:8]}."
    if request.htmx:
        return _approvals_page(request, notice=text)
    messages.success(request, text)
    return redirect(_approvals_url(request))


@require_POST
@viewer_required
def dual_confirm_view(request: ConsoleRequest, request_id: int) -> HttpResponse:
    return _dual_decide(request, request_id, "confirm")


@require_POST
@viewer_required
def dual_refuse_view(request: ConsoleRequest, request_id: int) -> HttpResponse:
    return _dual_decide(request, request_id, "refuse")


@require_POST
@viewer_required
def dual_withdraw_view(request: ConsoleRequest, request_id: int) -> HttpResponse:
    return _dual_decide(request, request_id, "withdraw")


def _decision_action(request: ConsoleRequest) -> str:
    return "approval.reject" if request.POST.get("decision", "") == "reject" else "approval.approve"


@require_POST
@action_view(_decision_action, "approval", id_kwarg="approval_id", text="comment")
def approval_decide(request: ConsoleRequest, approval_id: int) -> HttpResponse:
    # The role check comes before the decision is validated: an attempt by someone who may not
    # decide is audited (as an approval, unless it says reject) whatever it carried.
    action = _decision_action(request)
    approve = action == "approval.approve"
    approval = get_approval_for_user(request, approval_id, action=action)
    fields, problem = action_input(request, ApprovalDecideForm, action)
    if problem:
        return _approvals_page(request, status=400, error=problem)

    def done(decided: ApprovalRequest) -> str:
        verb = "Approved" if approve else "Rejected"
        return f"{verb} “{decided.step}” of run {str(decided.run_id)[:8]}; the run is woken."

    return _act(
        request,
        lambda: approval_act(
            actor_of(request), approval_id=approval.id, approve=approve, comment=fields["comment"],
            expected=fields["expected"] or None,
        ),
        success=done, refused_detail=lambda: approval_current_decision(approval.id),
        rerender=_approvals_page, back_to=_approvals_url(request),
    )

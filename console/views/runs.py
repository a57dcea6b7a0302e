"""The run detail page and the run actions (cancel, retry, compensate); the list is in run_list.py.

Live regions (``console.live``): the detail page has
``run_header``, ``run_history`` (entries newer than the first page), ``run_effects``,
``run_approvals`` and ``run_compensation``. Each is a ``runs_*.html``/``run_*.html`` template
rendered by the function registered below, which serves the full page (the page includes the
template with the same context), the htmx swap and the websocket push.

The actions region is deliberately not live: a push must not wipe a reason being typed, and its
hidden ``expected`` field must stay the status the user saw, so that an action on a run that
moved on meanwhile is refused (409) rather than applied to something else.

Actions are POSTs that go through ``console.services`` (role check, stale-state check, audit
entry in the same transaction). Denied answers 403 and refused 409, each with the reason; done
redirects back with a message, or, for htmx, returns the re-rendered actions region and the
header (out of band).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.models import AbstractBaseUser
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console import live, roles, selectors, services
from console.services import Denied, Incomplete, Refused
from console.templatetags.console_tags import redact
from console.views.base import actor_of, get_run_for_user, live_context, viewer_required
from ledger.models import EffectRecord
from sagas.compensation import compensation_preview
from sagas.models import (
    OPEN_APPROVAL_STATES,
    TERMINAL_STATUSES,
    CompensationPlan,
    RunStatus,
    WorkflowRun,
)

RUN_HEADER = "run_header"
RUN_HISTORY = "run_history"
RUN_EFFECTS = "run_effects"
RUN_APPROVALS = "run_approvals"
RUN_COMPENSATION = "run_compensation"
RUN_FRAGMENTS = [RUN_HEADER, RUN_HISTORY, RUN_EFFECTS, RUN_APPROVALS, RUN_COMPENSATION]

# Statuses from which an operator may start a compensation (sagas.compensation.compensation_start).
COMPENSABLE = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION,
                         RunStatus.FAILED})
# NEEDS_ATTENTION reasons that "retry" resolves (sagas.services.run_retry); the others have their own way out.
RETRYABLE_REASONS = frozenset({"budget_exceeded", "version_mismatch", "compensation_failed"})
NOT_RETRYABLE_HINTS = {
    "effect_unknown": "It waits for an unknown effect: resolve it on the ambiguous-effects page and the run "
                      "resumes by itself.",
    "compensation_unknown": "A compensation's outcome is unknown: resolve it on the ambiguous-effects page and "
                            "the compensation resumes by itself.",
    "approval_escalated": "An approval passed its deadline: approve or reject it in the approvals inbox.",
    "non_determinism": "Its code no longer replays its history: deploy the fix as a new version, then cancel or "
                       "compensate this run.",
}


def _url(name: str, fallback: str) -> str:
    """A page of another family, which may not be wired yet in every checkout."""
    try:
        return reverse(name)
    except NoReverseMatch:
        return fallback


# --- run detail: the context of each region ------------------------------------------------------


def _elapsed(run: WorkflowRun) -> timedelta | None:
    if run.started_at is None:
        return None
    return (run.finished_at or timezone.now()) - run.started_at


def _plain(value: Decimal | float | int) -> str:
    """A number as people write it: 0.25, 1200 (never 1.2E+3, never 0.250000)."""
    return format(Decimal(str(value)).normalize(), "f")


def _budget_rows(run: WorkflowRun) -> list[dict[str, Any]]:
    """Used against limit for steps, cost and duration (a limit of None: no limit)."""
    elapsed = _elapsed(run)
    seconds = round(elapsed.total_seconds(), 1) if elapsed else 0.0
    rows = [
        ("Steps", run.steps_used, run.max_steps),
        ("Cost (usd)", run.cost_used, run.max_cost),
        ("Duration (s)", seconds, round(run.max_duration.total_seconds(), 1) if run.max_duration else None),
    ]
    return [
        {"label": label, "used": _plain(used), "limit": _plain(limit) if limit is not None else "",
         "used_n": float(used), "limit_n": float(limit) if limit is not None else None,
         "low_n": float(limit) * 0.5 if limit is not None else None,
         "high_n": float(limit) * 0.8 if limit is not None else None,
         "over": limit is not None and float(used) >= float(limit) > 0}
        for label, used, limit in rows
    ]


def _header_context(run: WorkflowRun, *, oob: bool = False) -> dict[str, Any]:
    error = run.error
    if isinstance(error, dict):
        error_message = str(error.get("message") or "")
    else:
        error_message = error if isinstance(error, str) else ""
    now = timezone.now()
    return {
        "run": run,
        "error_message": error_message,
        "lease_live": bool(run.lease_expires_at and run.lease_expires_at > now),
        "budget": _budget_rows(run),
        "started_by": run.started_by.get_username() if run.started_by_id else "",
        "oob": oob,
    }


def _actions_context(run: WorkflowRun, user: AbstractBaseUser, *, has_plan: bool, error: str = "",
                     notice: str = "") -> dict[str, Any]:
    status = run.status
    possible = {
        "retry": status == RunStatus.NEEDS_ATTENTION and run.status_reason in RETRYABLE_REASONS,
        "cancel": status not in TERMINAL_STATUSES and status != RunStatus.COMPENSATING,
        "compensate": status in COMPENSABLE and not has_plan,
    }
    may = {name: ok and roles.can(user, f"run.{name}") for name, ok in possible.items()}
    hint = ""
    if status == RunStatus.NEEDS_ATTENTION and run.status_reason not in RETRYABLE_REASONS:
        hint = NOT_RETRYABLE_HINTS.get(run.status_reason, "")
    return {
        "run": run,
        "may": may,
        "possible_any": any(possible.values()),
        "may_any": any(may.values()),
        "action_hint": hint,
        "action_error": error,
        "action_notice": notice,
        "effects_url": _url("console:effects", "/effects/"),
        "approvals_url": _url("console:approvals", "/approvals/"),
    }


def _effects_context(run: WorkflowRun) -> dict[str, Any]:
    effects, more = selectors.run_effects(run.id)
    return {"run": run, "effects": effects, "effects_more": more, "effects_limit": selectors.RUN_EFFECTS_LIMIT,
            "effects_url": _url("console:effects", "/effects/")}


def _approvals_context(run: WorkflowRun, user: AbstractBaseUser) -> dict[str, Any]:
    return {
        "run": run,
        "approvals": list(selectors.run_approvals(run.id)),
        "open_states": OPEN_APPROVAL_STATES,
        "can_decide": roles.can(user, "approval.approve") or roles.can(user, "approval.reject"),
        "own_run": run.started_by_id is not None and run.started_by_id == user.pk,
        "approvals_url": _url("console:approvals", "/approvals/"),
    }


def _compensation_context(run: WorkflowRun, plan: CompensationPlan | None) -> dict[str, Any]:
    return {"run": run, "plan": plan, "effects_url": _url("console:effects", "/effects/")}


def _history_new_context(run: WorkflowRun, since: int) -> dict[str, Any]:
    entries, total = selectors.run_history_since(run.id, after=since)
    return {"run": run, "new_entries": entries, "new_total": total, "new_hidden": total - len(entries)}


# --- run detail: live fragments ------------------------------------------------------------------


def _run_from_params(params: Mapping[str, str]) -> WorkflowRun | None:
    try:
        run_id = uuid.UUID(str(params.get("run") or ""))
    except ValueError:
        return None
    return WorkflowRun.objects.select_related("started_by").filter(id=run_id).first()


def _missing(name: str) -> str:
    return render_to_string("console/run_missing.html", {"fragment": name})


@live.fragment(RUN_HEADER)
def run_header_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    run = _run_from_params(params)
    if run is None:
        return _missing(RUN_HEADER)
    return render_to_string("console/run_header.html", _header_context(run))


@live.fragment(RUN_HISTORY)
def run_history_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    """Entries appended since the page rendered its first history page (``since``: its newest
    seq). The paged history below stays as the user loaded it: nothing jumps, nothing is lost."""
    run = _run_from_params(params)
    if run is None:
        return _missing(RUN_HISTORY)
    try:
        since = max(int(params.get("since") or 0), 0)
    except ValueError:
        since = 0
    return render_to_string("console/run_history_live.html", _history_new_context(run, since))


@live.fragment(RUN_EFFECTS)
def run_effects_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    run = _run_from_params(params)
    if run is None:
        return _missing(RUN_EFFECTS)
    return render_to_string("console/run_effects.html", _effects_context(run))


@live.fragment(RUN_APPROVALS)
def run_approvals_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    run = _run_from_params(params)
    if run is None:
        return _missing(RUN_APPROVALS)
    return render_to_string("console/run_approvals.html", _approvals_context(run, user))


@live.fragment(RUN_COMPENSATION)
def run_compensation_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    run = _run_from_params(params)
    if run is None:
        return _missing(RUN_COMPENSATION)
    return render_to_string("console/run_compensation.html",
                            _compensation_context(run, selectors.run_compensation(run.id)))


# --- run detail: pages ---------------------------------------------------------------------------


def _run_page(request: HttpRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
              notice: str = "") -> HttpResponse:
    history = selectors.run_history_page(run.id)
    since = history.entries[0].seq if history.entries else 0
    plan = selectors.run_compensation(run.id)
    context: dict[str, Any] = {}
    context.update(_header_context(run))
    context.update(_actions_context(run, request.user, has_plan=plan is not None, error=error, notice=notice))
    context.update(_effects_context(run))
    context.update(_approvals_context(run, request.user))
    context.update(_compensation_context(run, plan))
    context.update(history=history, new_entries=[], new_total=0, new_hidden=0)
    context.update(live_context(RUN_FRAGMENTS, run=str(run.id), since=str(since)))
    return render(request, "console/run_detail.html", context, status=status)


@require_GET
@viewer_required
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    return _run_page(request, get_run_for_user(request, run_id))


@require_GET
@viewer_required
def run_history(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """The next page of history below ``before`` (a seq): the entries and a "load more" item for
    htmx, or a page of its own without JavaScript."""
    run = get_run_for_user(request, run_id)
    raw = request.GET.get("before", "").strip()
    try:
        before = int(raw) if raw else None
        if before is not None and before < 1:
            raise ValueError
    except ValueError:
        return HttpResponseBadRequest("before must be a journal sequence number (a whole number from 1)",
                                      content_type="text/plain; charset=utf-8")
    context = {"run": run, "history": selectors.run_history_page(run.id, before=before), "before": before}
    template = "console/run_history_entries.html" if request.htmx else "console/run_history.html"
    return render(request, template, context)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _history_json_parts(run: WorkflowRun) -> Iterator[str]:
    """``{"run": {...}, "entries": [...]}`` in pieces, one batch of entries at a time, every
    payload (and the run's input, result and error) redacted."""
    head = {
        "id": str(run.id), "workflow": run.workflow_name, "version": run.version,
        "definition_hash": run.definition_hash, "business_key": run.business_key, "tenant": run.tenant,
        "status": run.status, "status_reason": run.status_reason, "input": redact(run.input),
        "result": redact(run.result), "error": redact(run.error), "created_at": run.created_at,
        "finished_at": run.finished_at, "exported_at": timezone.now(), "redacted": True,
    }
    yield '{"run": ' + _dumps(head) + ', "entries": ['
    first = True
    for batch in selectors.run_history_batches(run.id):
        parts = []
        for entry in batch:
            entry["payload"] = redact(entry["payload"])
            parts.append(("\n" if first else ",\n") + _dumps(entry))
            first = False
        yield "".join(parts)
    yield "\n]}\n"


async def _async_parts(parts: Iterator[str]) -> AsyncIterator[str]:
    """Serve a sync generator that reads the database under ASGI without buffering it: each
    piece is produced in the request's sync thread."""
    step = sync_to_async(lambda: next(parts, None), thread_sensitive=True)
    while (piece := await step()) is not None:
        yield piece


@require_GET
@viewer_required
def run_history_json(request: HttpRequest, run_id: uuid.UUID) -> StreamingHttpResponse:
    run = get_run_for_user(request, run_id)
    parts = _history_json_parts(run)
    content = _async_parts(parts) if isinstance(request, ASGIRequest) else parts
    response = StreamingHttpResponse(content, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}-history.json"'
    response["Cache-Control"] = "no-store"
    return response


# --- run actions ---------------------------------------------------------------------------------


def _actions_response(request: HttpRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
                      notice: str = "") -> HttpResponse:
    """For htmx: the actions region, and after a change the header too (swapped out of band)."""
    has_plan = CompensationPlan.objects.filter(run_id=run.id).exists()
    html = render_to_string("console/run_actions.html",
                            _actions_context(run, request.user, has_plan=has_plan, error=error, notice=notice),
                            request=request)
    if notice:
        run = WorkflowRun.objects.select_related("started_by").get(id=run.id)
        html += render_to_string("console/run_header.html", _header_context(run, oob=True), request=request)
    return HttpResponse(html, status=status)


def _run_action(
    request: HttpRequest, run: WorkflowRun, action: str, call: Callable[[str, str | None], Any], *,
    done: Callable[[WorkflowRun], str], failed_page: Callable[..., HttpResponse],
) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    expected = request.POST.get("expected", "").strip()
    # Form mistakes of someone allowed to act are answered before anything is attempted. Anyone
    # else goes on to the service, which denies them and audits the attempt.
    if roles.can(request.user, action):
        problem = ""
        if not reason:
            problem = "A reason is required; it goes into the audit log and the run's history."
        elif not expected:
            problem = "The form did not say which status you saw; reload the page and try again."
        if problem:
            if request.htmx:
                return _actions_response(request, run, status=400, error=problem)
            return failed_page(request, run, status=400, error=problem)
    try:
        call(reason, expected or None)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        run.refresh_from_db()
        if request.htmx:
            return _actions_response(request, run, status=status, error=str(exc))
        return failed_page(request, run, status=status, error=str(exc))
    run.refresh_from_db()
    text = done(run)
    if request.htmx:
        return _actions_response(request, run, notice=text)
    messages.success(request, text)
    return redirect("console:run", run_id=run.id)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("on", "1", "true", "yes")


@require_POST
@viewer_required
def run_cancel(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    compensate = _truthy(request.POST.get("compensate"))

    def done(after: WorkflowRun) -> str:
        if after.status == RunStatus.COMPENSATING:
            return "Run cancelled; its completed effects are being compensated (see the plan below)."
        return "Run cancelled." + (" It had no completed effects to compensate." if compensate else "")

    return _run_action(
        request, run, "run.cancel",
        lambda reason, expected: services.run_cancel_act(
            actor_of(request), run_id=str(run.id), reason=reason, compensate=compensate, expected=expected),
        done=done, failed_page=_run_page,
    )


@require_POST
@viewer_required
def run_retry(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    return _run_action(
        request, run, "run.retry",
        lambda reason, expected: services.run_retry_act(
            actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=lambda after: f"Run retried: it is {after.status} again and queued for a worker.",
        failed_page=_run_page,
    )


def _compensate_page(request: HttpRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
                     notice: str = "") -> HttpResponse:
    items = compensation_preview(run=run)
    effects = EffectRecord.objects.in_bulk([item.effect_id for item in items])
    has_plan = CompensationPlan.objects.filter(run_id=run.id).exists()
    context = {
        "run": run,
        "rows": [{"item": item, "effect": effects.get(item.effect_id)} for item in items],
        "reversible": sum(1 for item in items if item.reversible),
        "irreversible": sum(1 for item in items if not item.reversible),
        "possible": run.status in COMPENSABLE and not has_plan,
        "has_plan": has_plan,
        "may": roles.can(request.user, "run.compensate"),
        "error": error,
    }
    return render(request, "console/run_compensate.html", context, status=status)


@require_http_methods(["GET", "POST"])
@viewer_required
def run_compensate(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """GET: the plan a compensation would follow (nothing is written) and a form to confirm it.
    POST: start it."""
    run = get_run_for_user(request, run_id)
    if request.method == "GET":
        return _compensate_page(request, run)

    def done(after: WorkflowRun) -> str:
        plan = selectors.run_compensation(after.id)
        count = len(plan.item_list) if plan else 0
        return f"Compensation started: {count} item{'s' if count != 1 else ''} to undo, newest first."

    return _run_action(
        request, run, "run.compensate",
        lambda reason, expected: services.run_compensate_act(
            actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=done, failed_page=_compensate_page,
    )

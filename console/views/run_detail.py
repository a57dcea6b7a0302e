"""The run detail page and its live regions; the history pages and export are in
run_history.py, the actions in run_actions.py.

Live regions (listed in ``console.live``): ``run_header``, ``run_actions`` (what may be done
to the run now, and why not), ``run_history`` (entries newer than the first page),
``run_effects``, ``run_approvals``, ``run_compensation``, ``run_conversation`` (an agent run's
turns, console/selectors/conversation.py; empty for other runs) and ``run_children`` (a
parent's child runs, sagas.children: counts by status and the oldest ones; empty for a run
that has none). Each is a ``run_*.html`` template
rendered by its ``*_fragment`` function below, which serves the full page (the page includes the
template with the same context), the htmx swap and the websocket push.

The actions region follows the run's state: once the run completes, Cancel is no longer offered,
and the hint that it waits for an unknown effect goes when it no longer does. Pushes morph the
page (console/static/console/live_morph.js), and a form someone is typing in is left exactly as
it is, its hidden ``expected`` field included: an action on a run that moved on meanwhile is
refused (409) rather than applied to something else. Results of actions are messages outside
the regions (console/views/notices.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.contrib.auth.models import User
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.selectors.conversation import run_conversation
from console.selectors.history import history_timeline, timeline_rows
from console.views.base import ConsoleRequest, get_run_for_user, live_context, viewer_required
from console.views.connectors import connector_anchor
from console.views.notices import page_messages
from console.views.run_archive import archived_get, run_archived_page
from core.redaction import redact_text
from ledger.flow.selectors import run_waiting_for
from operators import roles
from operators.models import DualControlRequest, DualState
from operators.selectors.runs import (
    RUN_EFFECTS_LIMIT,
    run_approvals,
    run_children,
    run_compensation,
    run_effects,
    run_forks,
    run_get,
    run_has_compensation,
    run_history_since,
    run_parent,
)
from sagas.integration import REDRIVABLE_REASONS, movable_versions, run_pause_info, trace_id_hex, trace_url
from sagas.models import (
    LEASED_STATUSES,
    OPEN_APPROVAL_STATES,
    TERMINAL_STATUSES,
    CompensationPlan,
    RunStatus,
    WorkflowRun,
)
from sagas.selectors import run_newest_seq

RUN_HEADER = "run_header"
RUN_ACTIONS = "run_actions"
RUN_HISTORY = "run_history"
RUN_EFFECTS = "run_effects"
RUN_APPROVALS = "run_approvals"
RUN_COMPENSATION = "run_compensation"
RUN_CONVERSATION = "run_conversation"
RUN_CHILDREN = "run_children"
RUN_FRAGMENTS = [RUN_HEADER, RUN_ACTIONS, RUN_HISTORY, RUN_EFFECTS, RUN_APPROVALS, RUN_COMPENSATION, RUN_CONVERSATION]

# Statuses from which an operator may start a compensation (sagas.compensation.compensation_start).
COMPENSABLE = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION,
                         RunStatus.FAILED})
# NEEDS_ATTENTION reasons that "retry" resolves (sagas.services.run_retry); the others have their own way out.
RETRYABLE_REASONS = frozenset({"budget_exceeded", "version_mismatch", "compensation_failed", "model_unavailable",
                               "journal_gap"})
NOT_RETRYABLE_HINTS = {
    "effect_unknown": "It waits for an unknown effect: resolve it on the ambiguous-effects page and the run "
                      "resumes by itself.",
    "compensation_unknown": "A compensation's outcome is unknown: resolve it on the ambiguous-effects page and "
                            "the compensation resumes by itself.",
    "approval_escalated": "An approval passed its deadline: approve or reject it in the approvals inbox.",
    "non_determinism": "Its code no longer replays its history: deploy the fix as a new version, then cancel or "
                       "compensate this run.",
}


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
    rows: list[tuple[str, Decimal | float | int, Decimal | float | int | None]] = [
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


def header_context(run: WorkflowRun, user: User, *, oob: bool = False) -> dict[str, Any]:
    """The ``run_header`` region (``oob``: swapped out of band after an htmx action)."""
    error = run.error
    if isinstance(error, dict):
        error_message = str(error.get("message") or "")
    else:
        error_message = error if isinstance(error, str) else ""
    now = timezone.now()
    waiting = run_waiting_for(run.id) if run.status not in TERMINAL_STATUSES else None
    return {
        "run": run,
        "entries": run_newest_seq(run),
        "error_message": redact_text(error_message),
        "lease_live": bool(run.lease_expires_at and run.lease_expires_at > now),
        "budget": _budget_rows(run),
        "started_by": run.started_by.get_username() if run.started_by else "",
        "pause": run_pause_info(run),
        # A call of the run that flow control holds: what it waits for and its place in the queue.
        "flow_wait": waiting,
        "flow_wait_url": reverse("console:connectors") + "#" + connector_anchor(waiting.connector) if waiting else "",
        "links": run_forks(run),
        "parent": run_parent(run, user=user),
        # The run's trace in the tracing tool (SAGAS_TRACE_URL_TEMPLATE); none when unset.
        "trace_url": trace_url(run.id),
        "trace_id": trace_id_hex(run.id),
        "oob": oob,
    }


def actions_context(run: WorkflowRun, user: User, *, has_plan: bool) -> dict[str, Any]:
    status = run.status
    possible = {
        "retry": status == RunStatus.NEEDS_ATTENTION and run.status_reason in RETRYABLE_REASONS,
        "cancel": status not in TERMINAL_STATUSES and status != RunStatus.COMPENSATING,
        "compensate": status in COMPENSABLE and not has_plan,
        "pause": status not in TERMINAL_STATUSES and run.paused_at is None,
        "resume": status not in TERMINAL_STATUSES and run.paused_at is not None,
    }
    versions = movable_versions(run)
    possible["move"] = bool(versions) and status in (RunStatus.PENDING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)
    possible["fork"] = not (status in LEASED_STATUSES and run.lease_expires_at is not None
                            and run.lease_expires_at > timezone.now())
    possible["redrive"] = (status == RunStatus.FAILED or (
        status == RunStatus.NEEDS_ATTENTION and run.status_reason in REDRIVABLE_REASONS)) and not has_plan
    may = {name: ok and roles.can(user, f"run.{name}") for name, ok in possible.items()}
    hint = ""
    if status == RunStatus.NEEDS_ATTENTION and run.status_reason not in RETRYABLE_REASONS:
        hint = NOT_RETRYABLE_HINTS.get(run.status_reason, "")
    return {
        "run": run,
        "versions": versions,
        "may": may,
        "possible_any": any(possible.values()),
        "may_any": any(may.values()),
        "action_hint": hint,
        "effects_url": reverse("console:effects"),
        "approvals_url": reverse("console:approvals"),
        # Dual control: what someone asked for on this run and a second person has not confirmed yet.
        "waiting_second": list(DualControlRequest.objects.filter(
            state=DualState.PENDING, deadline__gt=timezone.now(), object_type="run", object_id=str(run.id),
        ).order_by("deadline")[:5]),
    }


def _effects_context(run: WorkflowRun) -> dict[str, Any]:
    effects, more = run_effects(run.id)
    return {"run": run, "effects": effects, "effects_more": more, "effects_limit": RUN_EFFECTS_LIMIT,
            "effects_url": reverse("console:effects")}


def _approvals_context(run: WorkflowRun, user: User) -> dict[str, Any]:
    return {
        "run": run,
        "approvals": list(run_approvals(run.id)),
        "open_states": OPEN_APPROVAL_STATES,
        "can_decide": roles.can(user, "approval.approve") or roles.can(user, "approval.reject"),
        "own_run": run.started_by_id is not None and run.started_by_id == user.pk,
        "approvals_url": reverse("console:approvals"),
    }


def _compensation_context(run: WorkflowRun, plan: CompensationPlan | None) -> dict[str, Any]:
    return {"run": run, "plan": plan, "effects_url": reverse("console:effects")}


def _conversation_context(run: WorkflowRun, newest_names: list[str] | None = None) -> dict[str, Any]:
    return {"run": run, "conversation": run_conversation(run, newest_names), "effects_url": reverse("console:effects")}


def children_context(run: WorkflowRun, user: User) -> dict[str, Any]:
    """The ``run_children`` region: the run's children (none: the region is empty)."""
    children = run_children(run.id, user=user)
    runs_url = reverse("console:runs")
    return {
        "run": run,
        "children": children,
        "children_url": f"{runs_url}?{urlencode({'parent': str(run.id)})}",
    }


def _history_new_context(run: WorkflowRun, since: int) -> dict[str, Any]:
    entries, total = run_history_since(run.id, after=since)
    return {"run": run, "new_entries": timeline_rows(run.id, entries), "new_total": total,
            "new_hidden": total - len(entries)}


# --- run detail: live fragments ------------------------------------------------------------------


def _run_from_params(user: User, params: Mapping[str, str]) -> WorkflowRun | None:
    """The page's run, if the user may still see it (else the fragment says it is missing)."""
    return run_get(params.get("run") or None, user=user)


def _missing(name: str) -> str:
    return render_to_string("console/run_missing.html", {"fragment": name})


def run_header_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_HEADER)
    return render_to_string("console/run_header.html", header_context(run, user))


def run_actions_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_ACTIONS)
    return render_to_string("console/run_actions.html",
                            actions_context(run, user, has_plan=run_has_compensation(run.id)))


def run_history_fragment(user: User, params: dict[str, str]) -> str:
    """Entries appended since the page rendered its first history page (``since``: its newest
    seq). The paged history below stays as the user loaded it: nothing jumps, nothing is lost."""
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_HISTORY)
    try:
        since = max(int(params.get("since") or 0), 0)
    except ValueError:
        since = 0
    return render_to_string("console/run_history_live.html", _history_new_context(run, since))


def run_effects_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_EFFECTS)
    return render_to_string("console/run_effects.html", _effects_context(run))


def run_approvals_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_APPROVALS)
    return render_to_string("console/run_approvals.html", _approvals_context(run, user))


def run_compensation_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_COMPENSATION)
    return render_to_string("console/run_compensation.html",
                            _compensation_context(run, run_compensation(run.id)))


def run_conversation_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_CONVERSATION)
    return render_to_string("console/run_conversation.html", _conversation_context(run))


def run_children_fragment(user: User, params: dict[str, str]) -> str:
    run = _run_from_params(user, params)
    if run is None:
        return _missing(RUN_CHILDREN)
    return render_to_string("console/run_children.html", children_context(run, user))


# --- run detail: pages ---------------------------------------------------------------------------


def run_page(request: ConsoleRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
             notice: str = "") -> HttpResponse:
    """The whole detail page (also the answer to a failed action without htmx, with ``error``
    shown as a message)."""
    page_messages(request, error=error, notice=notice)
    history = history_timeline(run.id)  # compact rows: gaps, pairs (console/selectors/history.py)
    since = history.entries[0].seq if history.entries else 0
    plan = run_compensation(run.id)
    context: dict[str, Any] = {}
    context.update(header_context(run, request.user))
    context.update(actions_context(run, request.user, has_plan=plan is not None))
    context.update(children_context(run, request.user))
    context.update(_effects_context(run))
    context.update(_approvals_context(run, request.user))
    context.update(_compensation_context(run, plan))
    context.update(_conversation_context(run, [e.name for e in history.entries]))
    context.update(history=history, new_entries=[], new_total=0, new_hidden=0)
    # The children region is live while the run has children or may still start some: it follows
    # every run's changes (console/live.py), as a child's status moves without its parent's.
    watch_children = context["children"].total > 0 or run.status not in TERMINAL_STATUSES
    regions = [*RUN_FRAGMENTS, RUN_CHILDREN] if watch_children else RUN_FRAGMENTS
    context.update(live_context(regions, run=str(run.id), since=str(since)))
    return render(request, "console/run_detail.html", context, status=status)


@require_GET
@viewer_required
def run_detail(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    try:
        run = get_run_for_user(request, run_id)
    except Http404:  # retention may have archived it: then the page shows it from its file
        archived = archived_get(run_id, user=request.user)
        if archived is None:
            raise
        return run_archived_page(request, archived)
    return run_page(request, run)

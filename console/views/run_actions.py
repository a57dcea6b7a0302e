"""The run actions: cancel, retry, pause, resume, move, redrive and compensate (with a preview of
the plan first).

Actions are POSTs that go through ``operators.services`` (role check, stale-state check, audit
entry in the same transaction). Denied answers 403 and refused 409, each with the reason; done
redirects back with a message, or, for htmx, returns the re-rendered actions region, the header
(out of band) and the result as a message (out of band, into the messages area: see
console/views/notices.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import ActionForm, RunActionForm, RunVersionForm, posted_version
from console.views.base import ConsoleRequest, action_input, action_view, actor_of, get_run_for_user
from console.views.notices import message_oob
from console.views.run_detail import (
    COMPENSABLE,
    actions_context,
    header_context,
    run_page,
)
from operators import roles
from operators.selectors.runs import (
    compensation_item_count,
    effects_by_id,
    run_fork_steps,
    run_forks,
    run_get,
    run_has_compensation,
)
from operators.services.actions import Denied, Incomplete, Refused
from operators.services.dual_rules import ConfirmationNeeded
from operators.services.runs import (
    run_cancel_act,
    run_compensate_act,
    run_fork_act,
    run_move_act,
    run_pause_act,
    run_redrive_act,
    run_resume_act,
    run_retry_act,
)
from sagas.integration import compensation_preview, fork_plan, movable_versions
from sagas.models import RunStatus, WorkflowRun


def _fresh(request: ConsoleRequest, run: WorkflowRun) -> WorkflowRun:
    """The run as it is now, after an action (or an attempt)."""
    return run_get(run.id, user=request.user) or run


def _actions_response(request: ConsoleRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
                      notice: str = "") -> HttpResponse:
    """For htmx: the actions region, after a change the header too, and the result as a message
    (both swapped out of band). ``run``: as it is after the attempt."""
    has_plan = run_has_compensation(run.id)
    html = render_to_string("console/run_actions.html", actions_context(run, request.user, has_plan=has_plan),
                            request=request)
    if notice:
        html += render_to_string("console/run_header.html", header_context(run, request.user, oob=True),
                                 request=request)
    return HttpResponse(html + message_oob(error=error, notice=notice), status=status)


def _run_action(
    request: ConsoleRequest, run: WorkflowRun, action: str, call: Callable[..., Any], *,
    done: Callable[[WorkflowRun], str], failed_page: Callable[..., HttpResponse],
    form_class: type[ActionForm] = RunActionForm,
) -> HttpResponse:
    """``call(reason, expected)``, or with ``RunVersionForm`` ``call(reason, expected, version)``."""
    # Form mistakes of someone allowed to act are answered before anything is attempted (400,
    # nothing stored). Anyone else goes on to the service, which denies them and audits the
    # attempt, whatever they sent.
    fields, problem = action_input(request, form_class, action)
    if problem:
        if request.htmx:
            return _actions_response(request, run, status=400, error=problem)
        return failed_page(request, run, status=400, error=problem)
    reason, expected = fields["reason"], fields["expected"]
    extra = []
    if form_class is RunVersionForm:
        extra.append(posted_version(fields.get("version")))
    try:
        call(reason, expected or None, *extra)
    except ConfirmationNeeded as exc:  # dual control: stored for a second person, nothing done yet
        if request.htmx:
            return _actions_response(request, run, status=202, notice=str(exc))
        messages.info(request, str(exc))
        return redirect("console:run", run_id=run.id)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        run = _fresh(request, run)
        if request.htmx:
            return _actions_response(request, run, status=status, error=str(exc))
        return failed_page(request, run, status=status, error=str(exc))
    run = _fresh(request, run)
    text = done(run)
    if request.htmx:
        return _actions_response(request, run, notice=text)
    messages.success(request, text)
    return redirect("console:run", run_id=run.id)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("on", "1", "true", "yes")


@require_POST
@action_view("run.cancel", "run", id_kwarg="run_id")
def run_cancel(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.cancel")
    compensate = _truthy(request.POST.get("compensate"))

    def done(after: WorkflowRun) -> str:
        if after.status == RunStatus.COMPENSATING:
            return "Run cancelled; its completed effects are being compensated (see the plan below)."
        return "Run cancelled." + (" It had no completed effects to compensate." if compensate else "")

    return _run_action(
        request, run, "run.cancel",
        lambda reason, expected: run_cancel_act(
            actor_of(request), run_id=str(run.id), reason=reason, compensate=compensate, expected=expected),
        done=done, failed_page=run_page,
    )


@require_POST
@action_view("run.retry", "run", id_kwarg="run_id")
def run_retry(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.retry")
    return _run_action(
        request, run, "run.retry",
        lambda reason, expected: run_retry_act(
            actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=lambda after: f"Run retried: it is {after.status} again and queued for a worker.",
        failed_page=run_page,
    )


@require_POST
@action_view("run.pause", "run", id_kwarg="run_id")
def run_pause(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.pause")
    return _run_action(
        request, run, "run.pause",
        lambda reason, expected: run_pause_act(actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=lambda after: "Run paused: no worker takes it until it is resumed (a step in flight is recorded first).",
        failed_page=run_page,
    )


@require_POST
@action_view("run.resume", "run", id_kwarg="run_id")
def run_resume(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.resume")
    return _run_action(
        request, run, "run.resume",
        lambda reason, expected: run_resume_act(
            actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=lambda after: f"Run resumed: it is {after.status} and goes on where it stopped.",
        failed_page=run_page,
    )


@require_POST
@action_view("run.move", "run", id_kwarg="run_id")
def run_move(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.move")

    def call(reason: str, expected: str | None, version: int | None) -> Any:
        if version is None and roles.can(request.user, "run.move"):
            raise Incomplete("Choose the version to move the run to.")
        return run_move_act(actor_of(request), run_id=str(run.id), version=version or 0, reason=reason,
                            expected=expected)

    return _run_action(
        request, run, "run.move", call, form_class=RunVersionForm, failed_page=run_page,
        done=lambda after: f"Run moved to version {after.version}: it goes on with that code from where it was "
                           f"({after.status}).",
    )


@require_POST
@action_view("run.redrive", "run", id_kwarg="run_id")
def run_redrive(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = get_run_for_user(request, run_id, action="run.redrive")
    return _run_action(
        request, run, "run.redrive",
        lambda reason, expected, version: run_redrive_act(
            actor_of(request), run_id=str(run.id), version=version, reason=reason, expected=expected),
        form_class=RunVersionForm, failed_page=run_page,
        done=lambda after: f"Run redriven on version {after.version}: it goes on from where it stopped.",
    )


def _compensate_page(request: ConsoleRequest, run: WorkflowRun, *, status: int = 200, error: str = "",
                     notice: str = "") -> HttpResponse:
    items = compensation_preview(run=run)
    # A child run's item (sagas.children) undoes no effect of this run: its effect_id is None.
    effects = effects_by_id(item.effect_id for item in items if item.effect_id is not None)
    has_plan = run_has_compensation(run.id)
    context = {
        "run": run,
        "rows": [{"item": item, "effect": effects.get(item.effect_id) if item.effect_id is not None else None}
                 for item in items],
        "reversible": sum(1 for item in items if item.reversible),
        "irreversible": sum(1 for item in items if not item.reversible),
        "children": sum(1 for item in items if item.child_run),
        "possible": run.status in COMPENSABLE and not has_plan,
        "has_plan": has_plan,
        "may": roles.can(request.user, "run.compensate"),
        "error": error,
        "input_error": status == 400,  # the form's fault (the reason), not a refusal
    }
    return render(request, "console/run_compensate.html", context, status=status)


@require_http_methods(["GET", "POST"])
@action_view("run.compensate", "run", id_kwarg="run_id")
def run_compensate(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """GET: the plan a compensation would follow (nothing is written) and a form to confirm it.
    POST: start it."""
    run = get_run_for_user(request, run_id, action="run.compensate" if request.method == "POST" else "")
    if request.method == "GET":
        return _compensate_page(request, run)

    def done(after: WorkflowRun) -> str:
        count = compensation_item_count(after.id)
        return f"Compensation started: {count} item{'s' if count != 1 else ''} to undo, newest first."

    return _run_action(
        request, run, "run.compensate",
        lambda reason, expected: run_compensate_act(
            actor_of(request), run_id=str(run.id), reason=reason, expected=expected),
        done=done, failed_page=_compensate_page,
    )


def _fork_page(request: ConsoleRequest, run: WorkflowRun, *, at: int | None, undo: bool = False, status: int = 200,
               error: str = "") -> HttpResponse:
    steps = run_fork_steps(run.id)
    plan = fork_plan(run, at, compensate_first=undo) if at is not None else None
    context = {"run": run, "steps": steps, "plan": plan, "versions": movable_versions(run),
               "forks_seen": len(run_forks(run)["forks"]),
               "may": roles.can(request.user, "run.fork"), "error": error, "input_error": status == 400}
    return render(request, "console/run_fork.html", context, status=status)


def _at(value: object) -> int | None:
    text = str(value or "").strip()
    return int(text) if text.isdigit() and 0 < int(text) < 2**31 else None


def _count(value: object) -> int | None:
    """How many re-runs the form says the person saw; None if it did not say (an older page)."""
    text = str(value or "").strip()
    return int(text) if text.isdigit() and int(text) < 2**31 else None


@require_http_methods(["GET", "POST"])
@action_view("run.fork", "run", id_kwarg="run_id")
def run_fork(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """GET ``?at=<seq>[&undo=1]``: what re-running the run from that step would do, effect by
    effect, with the effects after it reused or (``undo``) compensated first; nothing is written.
    POST: make the new run, then go to it."""
    run = get_run_for_user(request, run_id, action="run.fork" if request.method == "POST" else "")
    if request.method == "GET":
        return _fork_page(request, run, at=_at(request.GET.get("at")), undo=request.GET.get("undo") == "1")
    at = _at(request.POST.get("at"))
    undo = request.POST.get("undo") == "1"
    fields, problem = action_input(request, RunVersionForm, "run.fork")
    if not problem and at is None and roles.can(request.user, "run.fork"):
        problem = "Choose the step to re-run from."
    if problem:
        return _fork_page(request, run, at=at, undo=undo, status=400, error=problem)
    version = posted_version(fields.get("version"))
    try:
        fork = run_fork_act(actor_of(request), run_id=str(run.id), at_seq=at or 0, version=version,
                            reason=fields["reason"], expected=fields["expected"] or None,
                            forks_seen=_count(request.POST.get("forks_seen")), compensate_first=undo)
    except ConfirmationNeeded as exc:
        messages.info(request, str(exc))
        return redirect("console:run", run_id=run.id)
    except (Denied, Incomplete, Refused) as exc:
        code = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        return _fork_page(request, _fresh(request, run), at=at, undo=undo, status=code, error=str(exc))
    undone = " Its later effects are compensated first." if undo else ""
    messages.success(request, f"Re-run from seq {at} of run {str(run.id)[:8]} as this run.{undone}")
    return redirect("console:run", run_id=fork.id)

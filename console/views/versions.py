"""The versions page (live region ``versions_list``) and the source diff between two versions.

The page's actions (pause and resume a workflow) are POSTs with CSRF through
``operators.services.runs``: 403 denied, 409 refused (stale page, someone faster), 400 a value
the form cannot take. The forms post through htmx, whose CSRF header comes from the page (a push
renders the region without the request, so its forms have no token field of their own): the
answer is the region as it is now and the result as a message out of band. Without JavaScript
they post as plain forms, answered with a redirect and a message, or the page with the refusal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from console.forms import WorkflowPauseForm, posted_version
from console.selectors.versions import (
    runs_stranded,
    runs_stranded_count,
    version_get,
    versions_of,
    versions_overview,
)
from console.selectors.versions import (
    version_diff as diff_lines,
)
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
from operators import roles
from operators.selectors.tenancy import may_see, tenants_of
from operators.services.actions import Denied, Incomplete, Refused
from operators.services.runs import workflow_pause_act, workflow_resume_act
from sagas.errors import InvalidArgument, WorkflowNotRegistered
from sagas.integration import definition_for, replay_check, runs_to_check
from sagas.models import TERMINAL_STATUSES, WorkflowVersion

VERSIONS_FRAGMENT = "versions_list"


def _versions_context(user: User, params: dict[str, str]) -> dict[str, Any]:
    return {
        "workflows": versions_overview(user=user),
        "stranded": list(runs_stranded(user=user)),
        "stranded_count": runs_stranded_count(user=user),
        # A workflow's pause holds every tenant's runs: offered to operators who see every tenant.
        "may_pause": roles.can(user, "workflow.pause") and tenants_of(user) is None,
    }


def versions_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/versions_live.html", _versions_context(user, params))


def _page(request: ConsoleRequest, *, status: int = 200) -> HttpResponse:
    context = _versions_context(request.user, {})
    context.update(live_context([VERSIONS_FRAGMENT]))
    return render(request, "console/versions.html", context, status=status)


@require_GET
@viewer_required
def versions(request: ConsoleRequest) -> HttpResponse:
    return _page(request)


def _version_or_404(value: str | None) -> WorkflowVersion:
    version = version_get(value)
    if version is None:
        raise Http404("no such workflow version")
    return version


@require_GET
@viewer_required
def version_diff(request: ConsoleRequest) -> HttpResponse:
    a = _version_or_404(request.GET.get("a"))
    b = _version_or_404(request.GET.get("b"))
    if a.name != b.name:
        return bad_request(request, f"Only versions of one workflow can be compared: “{a.name}” and “{b.name}” "
                                    f"are two workflows.", title="Not comparable")
    context = {"a": a, "b": b, "lines": diff_lines(a, b), "records": versions_of(a.name)}
    return render(request, "console/versions_diff.html", context)


def _answer(request: ConsoleRequest, *, status: int = 200, error: str = "", notice: str = "",
            workflow: str = "") -> HttpResponse:
    """For htmx: the region as it is now and the result as a message (out of band). Without
    JavaScript: the page again with the message (an error), or back to the workflow (done)."""
    if request.htmx:
        html = render_to_string("console/versions_live.html", _versions_context(request.user, {}), request=request)
        return HttpResponse(html + message_oob(error=error, notice=notice), status=status)
    if status >= 400:
        if status == 400:
            return bad_request(request, error)
        if status == 403:
            raise PermissionDenied(error)
        messages.error(request, error)
        return _page(request, status=status)
    messages.success(request, notice)
    return redirect(f"{reverse('console:versions')}#workflow-{slugify(workflow)}")


def _workflow_action(request: ConsoleRequest, action: str, act: Callable[..., Any],
                     done: Callable[[str, Any, int | None], str]) -> HttpResponse:
    """Pause or resume a workflow from the versions page, answered as ``_answer`` says. The
    service checks the role and the tenants and audits every attempt."""
    fields, problem = action_input(request, WorkflowPauseForm, action)
    if problem:
        return _answer(request, status=400, error=problem)
    name = fields["workflow"]
    version = posted_version(fields.get("version"))
    try:
        result = act(actor_of(request), name=name, version=version, reason=fields["reason"],
                     expected=fields["expected"] or None)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        return _answer(request, status=status, error=str(exc))
    return _answer(request, notice=done(name, result, version), workflow=name)


def _which(name: str, version: int | None) -> str:
    return f"{name} " + (f"version {version}" if version is not None else "(every version)")


@require_POST
@action_view("workflow.pause", "workflow", id_kwarg="workflow")
def workflow_pause(request: ConsoleRequest) -> HttpResponse:
    return _workflow_action(
        request, "workflow.pause", workflow_pause_act,
        lambda name, _, version: f"{_which(name, version)} paused: no worker takes its runs, new ones included, "
                                 f"until it is resumed; runs in flight stop after their current step.")


@require_POST
@action_view("workflow.resume", "workflow", id_kwarg="workflow")
def workflow_resume(request: ConsoleRequest) -> HttpResponse:
    return _workflow_action(
        request, "workflow.resume", workflow_resume_act,
        lambda name, queued, version: f"{_which(name, version)} resumed: {queued} run{'s' if queued != 1 else ''} "
                                      f"queued again at once; the sweeper finds the rest.")


CHECK_EXAMPLES = 20  # runs shown per outcome on the check page


@require_GET
@viewer_required
def version_check(request: ConsoleRequest) -> HttpResponse:
    """Would this version's code resume the runs in flight? ``?workflow=&version=``: the runs in
    flight of the user's tenants (and a few recently finished) replayed against that code,
    nothing executed or written; counts, examples (diverging and failing first), and the source
    diff between the runs' code and this version, side by side. Read-only: any role."""
    name = str(request.GET.get("workflow", ""))[:200]
    version = posted_version(request.GET.get("version", ""))
    if not name or version is None:
        return bad_request(request, "Choose a workflow and one of its versions to check.", title="Nothing to check")
    try:
        definition = definition_for(name, version)
    except (WorkflowNotRegistered, InvalidArgument) as exc:
        return bad_request(request, f"{exc}: only code registered in the web process can be checked here; "
                                    f"use manage.py sagas_replay_check --module for code not deployed yet.",
                           title="Not registered here")
    runs = [run for run in runs_to_check(name, sample=20) if may_see(request.user, run.tenant)]
    report = replay_check(definition, runs)
    ordered = sorted(report.runs, key=lambda r: {"diverges": 0, "error": 1}.get(r.outcome, 2))
    target = WorkflowVersion.objects.filter(name=name, definition_hash=definition.definition_hash).first()
    sources = Counter(run.definition_hash for run in runs if run.definition_hash != definition.definition_hash)
    common = sources.most_common(1)[0][0] if sources else None
    base = WorkflowVersion.objects.filter(name=name, definition_hash=common).first() if common else None
    context = {
        "definition": definition, "report": report, "examples": ordered[:CHECK_EXAMPLES],
        "more": max(0, len(ordered) - CHECK_EXAMPLES), "base": base, "target": target,
        "lines": diff_lines(base, target) if base and target else [],
        "pane_a": base.source.splitlines() if base else [], "pane_b": target.source.splitlines() if target else [],
        "movable": [r for r in report.runs if r.outcome == "compatible" and r.status not in TERMINAL_STATUSES],
    }
    return render(request, "console/versions_check.html", context)

"""The queues people work through: ambiguous effects and the approvals inbox; and the versions page.

Each page is a live region (``console.live``): the page, the htmx swap after an action and the
websocket push all render the same ``<page>_live.html`` fragment. Actions are POSTs that go
through ``console.services`` (role check, stale-state check, audit entry): a denied action answers
403 and a refused one 409, each with the page and the reason; a successful one redirects back
with a message, or returns the re-rendered fragment to htmx.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import AbstractBaseUser
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console import live, roles, selectors, services
from console.services import Denied, Incomplete, Refused
from console.views.base import actor_of, live_context, viewer_required
from ledger.models import EffectRecord
from sagas.models import ApprovalRequest, ApprovalState, WorkflowVersion

EFFECTS_FRAGMENT = "effects_queue"
APPROVALS_FRAGMENT = "approvals_inbox"
VERSIONS_FRAGMENT = "versions_list"

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
    request: HttpRequest,
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
    request: HttpRequest, *, page: str, fragment_template: str, context: dict[str, Any], live: dict[str, Any],
    status: int,
) -> HttpResponse:
    if request.htmx and request.method == "POST":
        return HttpResponse(render_to_string(fragment_template, context, request=request), status=status)
    context.update(live)
    return render(request, page, context, status=status)


# --- ambiguous effects ---------------------------------------------------------------------------


def _effects_context(user: AbstractBaseUser, params: dict[str, str]) -> dict[str, Any]:
    cursor = params.get("after") or ""
    return {
        "page": selectors.effects_ambiguous_page(cursor=cursor or None),
        "cursor": cursor,
        "can_query": roles.can(user, "effect.query"),
        "can_resolve": roles.can(user, "effect.resolve"),
        "outcomes": RESOLVE_OUTCOMES,
    }


@live.fragment(EFFECTS_FRAGMENT)
def effects_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    try:
        context = _effects_context(user, params)
    except selectors.BadCursor:
        context = _effects_context(user, {})
    return render_to_string("console/effects_live.html", context)


def _effects_page(request: HttpRequest, *, status: int = 200, error: str = "", notice: str = "") -> HttpResponse:
    if request.method == "POST":  # after an action: the page it came from, or the first one
        cursor = request.POST.get("after", "")
        cursor = cursor if _cursor_ok(cursor) else ""
    else:
        cursor = request.GET.get("after", "")
    try:
        context = _effects_context(request.user, {"after": cursor})
    except selectors.BadCursor as exc:
        return HttpResponseBadRequest(str(exc))
    context.update(error=error, notice=notice)
    return _respond(request, page="console/effects.html", fragment_template="console/effects_live.html",
                    context=context, live=live_context([EFFECTS_FRAGMENT], after=cursor), status=status)


@require_GET
@viewer_required
def effects(request: HttpRequest) -> HttpResponse:
    return _effects_page(request)


def _effect_or_404(effect_id: int) -> EffectRecord:
    return get_object_or_404(EffectRecord, id=effect_id)


def _effects_url(request: HttpRequest) -> str:
    url = reverse("console:effects")
    cursor = request.POST.get("after", "")
    return f"{url}?after={cursor}" if _cursor_ok(cursor) else url


def _cursor_ok(cursor: str) -> bool:
    if not cursor:
        return False
    try:
        selectors.decode_cursor(cursor)
    except selectors.BadCursor:
        return False
    return True


@require_POST
@viewer_required
def effect_query(request: HttpRequest, effect_id: int) -> HttpResponse:
    effect = _effect_or_404(effect_id)

    def said(answer: str) -> str:
        return f"Provider lookup for effect #{effect.id} ({effect.step_name}): {QUERY_ANSWERS.get(answer, answer)}"

    return _act(
        request, lambda: services.effect_query(actor_of(request), effect_id=effect.id),
        success=said, refused_detail=lambda: selectors.effect_current_outcome(effect.id),
        rerender=_effects_page, back_to=_effects_url(request),
    )


@require_POST
@viewer_required
def effect_resolve(request: HttpRequest, effect_id: int) -> HttpResponse:
    effect = _effect_or_404(effect_id)
    outcome = request.POST.get("outcome", "")
    downstream_ref = request.POST.get("downstream_ref", "").strip()
    note = request.POST.get("note", "")

    def done(resolved: EffectRecord) -> str:
        ref = f", reference {downstream_ref}" if outcome == "succeeded" else ""
        return f"Effect #{resolved.id} ({resolved.step_name}) resolved as {outcome}{ref}; its run is woken."

    return _act(
        request,
        lambda: services.effect_manual_resolve(
            actor_of(request), effect_id=effect.id, outcome=outcome, downstream_ref=downstream_ref, note=note,
            expected=request.POST.get("expected") or None,
        ),
        success=done, refused_detail=lambda: selectors.effect_current_outcome(effect.id),
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


def _approvals_context(user: AbstractBaseUser, params: dict[str, str]) -> dict[str, Any]:
    now = timezone.now()
    open_qs = selectors.approvals_open()
    items = list(open_qs[: selectors.INBOX_LIMIT])
    rows = [
        {
            "a": a,
            "remaining": remaining_text(a.deadline, now),
            "overdue": a.deadline <= now,
            "escalated": a.state == ApprovalState.ESCALATED,
            "own_run": a.run.started_by_id is not None and a.run.started_by_id == user.pk,
        }
        for a in items
    ]
    return {
        "rows": rows,
        "total": len(items) if len(items) < selectors.INBOX_LIMIT else open_qs.count(),
        "limit": selectors.INBOX_LIMIT,
        "recent": list(selectors.approvals_recently_decided()),
        "can_approve": roles.can(user, "approval.approve"),
        "can_reject": roles.can(user, "approval.reject"),
    }


@live.fragment(APPROVALS_FRAGMENT)
def approvals_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    return render_to_string("console/approvals_live.html", _approvals_context(user, params))


def _approvals_page(request: HttpRequest, *, status: int = 200, error: str = "", notice: str = "") -> HttpResponse:
    context = _approvals_context(request.user, {})
    context.update(error=error, notice=notice)
    return _respond(request, page="console/approvals.html", fragment_template="console/approvals_live.html",
                    context=context, live=live_context([APPROVALS_FRAGMENT]), status=status)


@require_GET
@viewer_required
def approvals(request: HttpRequest) -> HttpResponse:
    return _approvals_page(request)


@require_POST
@viewer_required
def approval_decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(ApprovalRequest, id=approval_id)
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "reject"):
        return HttpResponseBadRequest("decision must be approve or reject")
    approve = decision == "approve"

    def done(decided: ApprovalRequest) -> str:
        verb = "Approved" if approve else "Rejected"
        return f"{verb} “{decided.step}” of run {str(decided.run_id)[:8]}; the run is woken."

    return _act(
        request,
        lambda: services.approval_act(
            actor_of(request), approval_id=approval.id, approve=approve,
            comment=request.POST.get("comment", "").strip(), expected=request.POST.get("expected") or None,
        ),
        success=done, refused_detail=lambda: selectors.approval_current_decision(approval.id),
        rerender=_approvals_page, back_to=reverse("console:approvals"),
    )


# --- versions ------------------------------------------------------------------------------------


def _versions_context(user: AbstractBaseUser, params: dict[str, str]) -> dict[str, Any]:
    return {
        "workflows": selectors.versions_overview(),
        "stranded": list(selectors.runs_stranded()),
        "stranded_count": selectors.runs_stranded_count(),
    }


@live.fragment(VERSIONS_FRAGMENT)
def versions_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    return render_to_string("console/versions_live.html", _versions_context(user, params))


@require_GET
@viewer_required
def versions(request: HttpRequest) -> HttpResponse:
    context = _versions_context(request.user, {})
    context.update(live_context([VERSIONS_FRAGMENT]))
    return render(request, "console/versions.html", context)


def _version_or_404(value: str | None) -> WorkflowVersion:
    try:
        return WorkflowVersion.objects.get(id=int(value or ""))
    except (ValueError, WorkflowVersion.DoesNotExist) as exc:
        raise Http404("no such workflow version") from exc


@require_GET
@viewer_required
def version_diff(request: HttpRequest) -> HttpResponse:
    a = _version_or_404(request.GET.get("a"))
    b = _version_or_404(request.GET.get("b"))
    if a.name != b.name:
        return HttpResponseBadRequest(
            f"only versions of one workflow can be compared: {a.name!r} and {b.name!r} differ"
        )
    context = {
        "a": a,
        "b": b,
        "lines": selectors.version_diff(a, b),
        "records": list(WorkflowVersion.objects.filter(name=a.name).order_by("-version", "-last_registered_at")),
    }
    return render(request, "console/versions_diff.html", context)

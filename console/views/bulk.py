"""Bulk actions: the preview (how many, a sample, the reason and the confirmation), the batch's
page with its live progress (``bulk_batch``), and the recent batches.

The list pages (runs, ambiguous effects, approvals) post their ticked rows, or their current
filters, to ``bulk_preview``; that makes a draft batch and redirects to its page, which shows
the preview until it is confirmed and the progress after. Everything goes through
``console.services.bulk``: role checks (denied attempts audited), the expected state of each
item, and the audit entries.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST

from console.forms import version_number
from console.models import BulkBatch, BulkState
from console.selectors.bulk import (
    ACTIONS,
    BadSelection,
    batch_get,
    batch_problems,
    batch_sample,
    batch_versions,
    batches_recent,
    filter_params,
    own_runs_among,
)
from console.services.bulk import MAX_ITEMS, batch_confirm, batch_denied, batch_preview
from console.views.base import ConsoleRequest, actor_of, bad_request, live_context, viewer_required
from ledger.services import RESOLUTION_OUTCOMES
from operators import roles
from operators.services.actions import Denied, Incomplete, Refused
from operators.services.dual_rules import ConfirmationNeeded

BULK_FRAGMENT = "bulk_batch"
OUTCOME_LABELS = {
    "succeeded": "succeeded: the provider did it (give its reference)",
    "not_executed": "not executed: the provider never did it (retried with the same key)",
    "failed": "failed: it did not happen and must not be retried",
}


def _turn_away(request: ConsoleRequest, field: str = "action") -> None:
    """Someone logged in with no console role: audited as denied, 403."""
    if not roles.can_view(request.user):
        batch_denied(actor_of(request), action=str(request.POST.get(field, "")),
                     reason=str(request.POST.get("reason", "")))
        raise PermissionDenied("your account has no console role")


@require_POST
@login_required
def bulk_preview(request: ConsoleRequest) -> HttpResponse:
    _turn_away(request)
    name = str(request.POST.get("action", ""))
    action = ACTIONS.get(name)
    if action is None:
        return bad_request(request, f"Choose a bulk action: {', '.join(ACTIONS)}. Nothing was selected.")
    everything = request.POST.get("scope", "") == "filter"
    ids = None if everything else request.POST.getlist("ids")
    if ids is not None and not ids:
        return bad_request(request, "Tick at least one row, or choose everything matching the filters.")
    if ids is not None and len(ids) > MAX_ITEMS:
        return bad_request(request, f"At most {MAX_ITEMS:,} rows can be ticked.")
    filters = {key: str(request.POST.get(key, "")) for key in filter_params(action.kind)}
    try:
        batch = batch_preview(actor_of(request), action=name, ids=ids, filters=filters)
    except Denied as exc:
        return render(request, "console/error.html", {"title": "Not allowed", "message": str(exc)}, status=403)
    except (BadSelection, Incomplete) as exc:
        return bad_request(request, str(exc))
    return redirect("console:bulk_batch", token=batch.token)


def _preview(request: ConsoleRequest, batch: BulkBatch, *, status: int = 200, error: str = "",
             typed: dict[str, str] | None = None) -> HttpResponse:
    action = ACTIONS[batch.action]
    context: dict[str, Any] = {
        "batch": batch, "action": action, "sample": batch_sample(batch, action), "error": error,
        "input_error": status == 400,  # something typed (or left out) is wrong, not a denial
        "typed": typed or {}, "outcomes": [(o, OUTCOME_LABELS[o]) for o in RESOLUTION_OUTCOMES],
        "own_runs": own_runs_among(batch) if action.object_type == "approval" else 0,
        "filters": batch.selection.get("filter"),
        "versioned": batch.action in ("run.move", "run.redrive"),
        "versions": batch_versions(batch) if batch.action in ("run.move", "run.redrive") else [],
    }
    return render(request, "console/bulk_preview.html", context, status=status)


def batch_context(batch: BulkBatch) -> dict[str, Any]:
    action = ACTIONS[batch.action]
    elapsed = None
    if batch.started_at:
        elapsed = ((batch.finished_at or batch.heartbeat_at or batch.started_at) - batch.started_at).total_seconds()
    return {
        "batch": batch, "action": action, "problems": batch_problems(batch), "elapsed": elapsed,
        "rate": round(batch.done / elapsed, 1) if elapsed else None,
        "percent": int(100 * batch.done / batch.total) if batch.total else 100,
    }


def bulk_batch_fragment(user: User, params: dict[str, str]) -> str:
    batch = batch_get(params.get("batch", ""), user=user)
    if batch is None or batch.state == BulkState.DRAFT:
        return '<div id="live-bulk_batch"></div>'
    return render_to_string("console/bulk_batch_live.html", batch_context(batch))


def _visible(request: ConsoleRequest, token: Any) -> BulkBatch:
    batch = batch_get(token, user=request.user)
    # A draft is its author's only: nobody else may confirm it, or see what it would do.
    if batch is None or (batch.state == BulkState.DRAFT and batch.user_id != request.user.pk):
        raise Http404("no such batch")
    return batch


@require_GET
@viewer_required
def bulk_batch(request: ConsoleRequest, token: Any) -> HttpResponse:
    batch = _visible(request, token)
    if batch.state == BulkState.DRAFT:
        return _preview(request, batch)
    context = batch_context(batch)
    context.update(live_context([BULK_FRAGMENT], batch=str(batch.token)))
    return render(request, "console/bulk_batch.html", context)


@require_POST
@login_required
def bulk_confirm(request: ConsoleRequest, token: Any) -> HttpResponse:
    _turn_away(request, field="")
    batch = _visible(request, token)
    typed = {key: str(request.POST.get(key, "")) for key in ("reason", "outcome", "downstream_ref", "version")}
    try:
        version = version_number(typed["version"].strip())
    except ValidationError as exc:
        return _preview(request, batch, status=400, typed=typed, error=f"{exc.messages[0]} Nothing was queued.")
    try:
        batch = batch_confirm(
            actor_of(request), token=batch.token, reason=typed["reason"],
            confirmed=request.POST.get("confirm") == "yes",
            outcome=typed["outcome"], evidence=typed["downstream_ref"],
            version=version,
        )
    except ConfirmationNeeded as exc:  # dual control: the batch waits for a second person
        messages.info(request, str(exc))
        return redirect("console:approvals")
    except Denied as exc:
        return _preview(request, batch, status=403, error=str(exc), typed=typed)
    except Incomplete as exc:
        return _preview(request, batch, status=400, error=str(exc), typed=typed)
    except Refused as exc:  # a request for this batch waits already (a double submit)
        return _preview(request, batch, status=409, error=str(exc), typed=typed)
    return redirect("console:bulk_batch", token=batch.token)


@require_GET
@viewer_required
def bulk_batches(request: ConsoleRequest) -> HttpResponse:
    return render(request, "console/bulk_batches.html", {"batches": batches_recent(user=request.user)})

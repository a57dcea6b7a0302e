"""A run's history: the timeline page (one compact row per journal entry, newest first, a page
at a time: "older" and "newer" links, a filter by kind, a jump to a seq), the older pages the
run's page loads with htmx ("load more"), and the whole history as redacted JSON, streamed.

Bad input (a ``before``, ``kind`` or ``seq`` the form refuses, a seq past the run's last entry)
is a 400: the page with the problem next to the form and no history read with it (a plain-text
400 to htmx)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import (
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.history_forms import HistoryPageForm
from console.selectors.history import history_jump_before, history_timeline, kinds_for
from console.views.base import ConsoleRequest, get_run_for_user, viewer_required
from core.redaction import redact
from core.replica import follow
from operators.selectors.runs import run_history_batches
from sagas.models import WorkflowRun
from sagas.selectors import run_newest_seq


def _page(request: ConsoleRequest, run: WorkflowRun, form: HistoryPageForm, *, status: int = 200,
          newest: int | None = None) -> HttpResponse:
    """``newest``: the run's newest seq, when the caller has already read it."""
    context: dict[str, Any] = {"run": run, "entries": run_newest_seq(run) if newest is None else newest,
                               "form": form, "history": None, "before": None, "kind": ""}
    if status == 200:
        before, kind = form.cleaned_data["before"], form.cleaned_data["kind"]
        context.update(before=before, kind=kind,
                       history=history_timeline(run.id, before=before, kinds=kinds_for(kind), newer=True))
    return render(request, "console/run_history.html", context, status=status)


@require_GET
@viewer_required
def run_history(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """The timeline page; to htmx, the rows below ``before`` and a "load more" item."""
    run = get_run_for_user(request, run_id)
    form = HistoryPageForm(request.GET)
    if not form.is_valid():
        if request.htmx:
            return HttpResponseBadRequest(" ".join(form.problems()), content_type="text/plain; charset=utf-8")
        return _page(request, run, form, status=400)
    seq = form.cleaned_data["seq"]
    if seq is not None:
        newest = run_newest_seq(run)
        if seq > newest:
            form.add_error("seq", f"Go to entry: this run has no entry #{seq}; its entries are #1 to #{newest}.")
            return _page(request, run, form, status=400, newest=newest)
        before = history_jump_before(newest, seq)
        url = reverse("console:run_history", args=[run.id])
        return HttpResponseRedirect(f"{url}{f'?before={before}' if before else ''}#seq-{seq}")
    if request.htmx:
        before, kind = form.cleaned_data["before"], form.cleaned_data["kind"]
        history = history_timeline(run.id, before=before, kinds=kinds_for(kind))
        return render(request, "console/run_history_entries.html",
                      {"run": run, "history": history, "before": before, "kind": kind})
    return _page(request, run, form)


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
    for batch in run_history_batches(run.id):
        parts = []
        for entry in batch:
            entry["payload"] = redact(entry["payload"])
            parts.append(("\n" if first else ",\n") + _dumps(entry))
            first = False
        yield "".join(parts)
    yield "\n]}\n"


async def async_parts(parts: Iterator[str]) -> AsyncIterator[str]:
    """Serve a sync generator that reads the database under ASGI without buffering it: each
    piece is produced in the request's sync thread."""
    step = sync_to_async(lambda: next(parts, None), thread_sensitive=True)
    while (piece := await step()) is not None:
        yield piece


@require_GET
@viewer_required
def run_history_json(request: ConsoleRequest, run_id: UUID) -> StreamingHttpResponse:
    run = get_run_for_user(request, run_id)
    parts = follow(_history_json_parts(run))  # from the standby, as the page, if the page is
    content = async_parts(parts) if isinstance(request, ASGIRequest) else parts
    response = StreamingHttpResponse(content, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}-history.json"'
    response["Cache-Control"] = "no-store"
    return response

"""A run's history beyond the detail page's first page: older pages ("load more", or a page of
their own without JavaScript) and the whole history as redacted JSON, streamed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from config.redaction import redact
from console.forms import HistoryPageForm
from console.selectors.runs import run_history_batches, run_history_page
from console.views.base import get_run_for_user, viewer_required
from sagas.models import WorkflowRun


@require_GET
@viewer_required
def run_history(request: HttpRequest, run_id: UUID) -> HttpResponse:
    """The next page of history below ``before`` (a seq): the entries and a "load more" item for
    htmx, or a page of its own without JavaScript."""
    run = get_run_for_user(request, run_id)
    form = HistoryPageForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(HistoryPageForm.BEFORE_ERROR, content_type="text/plain; charset=utf-8")
    before = form.cleaned_data["before"]
    context = {"run": run, "history": run_history_page(run.id, before=before), "before": before}
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
    for batch in run_history_batches(run.id):
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
def run_history_json(request: HttpRequest, run_id: UUID) -> StreamingHttpResponse:
    run = get_run_for_user(request, run_id)
    parts = _history_json_parts(run)
    content = _async_parts(parts) if isinstance(request, ASGIRequest) else parts
    response = StreamingHttpResponse(content, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}-history.json"'
    response["Cache-Control"] = "no-store"
    return response

"""One stored value in full, on demand: the "show all of it" and "download" links under a
truncated payload (console/templatetags/payloads.py).

``runs/<run>/payload/<kind>/`` (input, result, error), ``runs/<run>/payload/<kind>/<id>/`` (entry
by seq, effect-request, effect-result, effect-error, approval-reason) and
``audit/<id>/payload/<kind>/`` (before, after, reason). Any console role may read them; the run
is looked up as its page does (404 for an unknown run or item, or a kind nobody stores), and an
audit entry only among those the user may see (404 for another tenant's: tenancy.py).

What it answers, always redacted with the pages' policy:

* to htmx, the whole value as an escaped HTML fragment that replaces the truncated block; above
  ``EXPAND_MAX_CHARS``, the block again with only a download link (nothing large is swapped in);
* with ``?download``, or when the value is above ``EXPAND_MAX_CHARS``, an attachment
  (``application/json`` for JSON values, ``text/plain`` for free text);
* otherwise (the link followed without JavaScript) the whole value as ``text/plain``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from console.selectors.payloads import TEXT_KINDS, audit_value, run_item_value, run_value
from console.templatetags.payloads import (
    EXPAND_MAX_CHARS,
    long_text_context,
    payload_context,
    payload_text,
    plain_text,
    preview_html,
    size_of,
)
from console.views.base import ConsoleRequest, get_run_for_user, viewer_required
from operators.models import AuditEntry
from operators.selectors.tenancy import scope


def _answer(request: ConsoleRequest, value: Any, *, kind: str, name: str) -> HttpResponse:
    is_text = kind in TEXT_KINDS
    shape = "text" if is_text else "json"
    size = size_of(value, text=is_text)
    large = size > EXPAND_MAX_CHARS
    if request.htmx and large:  # only a hand-made request gets here: the page offers a download
        block = long_text_context(value, request.path) if is_text else payload_context(value, request.path)
        response = HttpResponse(preview_html(block))
    else:
        text = plain_text(value) if is_text else payload_text(value)
        if request.htmx:
            response = render(request, "console/payload_full.html", {"text": text, "kind": shape})
        elif "download" in request.GET or large:
            content_type = "text/plain; charset=utf-8" if is_text else "application/json; charset=utf-8"
            response = HttpResponse(text, content_type=content_type)
            response["Content-Disposition"] = f'attachment; filename="{name}.{"txt" if is_text else "json"}"'
        else:
            response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    patch_vary_headers(response, ["HX-Request"])
    return response


@require_GET
@viewer_required
def run_payload(request: ConsoleRequest, run_id: UUID, kind: str, item_id: int | None = None) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    if item_id is None:
        found, value = run_value(run, kind)
        name = f"run-{run.id}-{kind}"
    else:
        found, value = run_item_value(run, kind, item_id)
        name = f"run-{run.id}-{kind}-{item_id}"
    if not found:
        raise Http404("no such value")
    return _answer(request, value, kind=kind, name=name)


@require_GET
@viewer_required
def audit_payload(request: ConsoleRequest, entry_id: int, kind: str) -> HttpResponse:
    found, value = audit_value(scope(AuditEntry.objects.all(), request.user), entry_id, kind)
    if not found:
        raise Http404("no such value")
    return _answer(request, value, kind=kind, name=f"audit-{entry_id}-{kind}")

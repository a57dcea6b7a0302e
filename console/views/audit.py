"""The audit log page and its CSV export. Read-only: nothing here writes, and the table refuses
UPDATE and DELETE in the database as well."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.forms import AuditFilterForm
from console.selectors.audit import AuditFilters, audit_known_values, audit_page, audit_rows
from console.views.base import ConsoleRequest, live_context, viewer_required
from console.views.run_history import async_parts
from core.redaction import redact, redact_text
from core.replica import follow
from operators.models import AuditEntry

AUDIT_FRAGMENT = "audit_log"
CSV_CHUNK = 2000
CSV_HEADER = ["created_at", "actor", "action", "object_type", "object_id", "outcome", "reason", "message",
              "before", "after", "ip"]
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _audit_context(user: User, params: Mapping[str, str]) -> dict[str, Any]:
    form = AuditFilterForm(params)
    page = audit_page(form.filters(), user=user, cursor=form.cursor) if form.is_valid() else None
    return {"form": form, "cursor": form.cursor_text, "known": audit_known_values(),
            "filter_qs": urlencode(form.filter_params()), "page": page,
            "rows": audit_rows(page.items, user=user) if page is not None else []}


def audit_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/audit_live.html", _audit_context(user, params))


@require_GET
@viewer_required
def audit_log(request: ConsoleRequest) -> HttpResponse:
    """The log, filtered, a keyset page at a time. Invalid filters (or a damaged page cursor)
    answer 400 with the form and what is wrong with it, and no entries."""
    context = _audit_context(request.user, request.GET)
    form: AuditFilterForm = context["form"]
    context.update(live_context([AUDIT_FRAGMENT], **form.filter_params(), after=context["cursor"]))
    return render(request, "console/audit.html", context, status=200 if context["page"] is not None else 400)


# --- CSV export ------------------------------------------------------------------------------------


class _Echo:
    """csv.writer target that hands each formatted row back instead of storing it."""

    def write(self, value: str) -> str:
        return value


def _cell(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA_START) else value


def _payload(value: Any) -> str:
    return "" if value is None else json.dumps(redact(value), sort_keys=True, ensure_ascii=False, default=str)


def csv_row(entry: AuditEntry) -> list[str]:
    return [
        entry.created_at.isoformat(), _cell(entry.actor_label), _cell(entry.action), _cell(entry.object_type),
        _cell(entry.object_id), entry.outcome, _cell(redact_text(entry.reason)), _cell(redact_text(entry.message)),
        _cell(_payload(entry.before)), _cell(_payload(entry.after)), entry.ip or "",
    ]


def _rows_sync(filters: AuditFilters, user: User) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    cursor = None
    while True:
        page = audit_page(filters, user=user, cursor=cursor, size=CSV_CHUNK)
        for entry in page.items:
            yield writer.writerow(csv_row(entry))
        if page.next is None:
            return
        cursor = page.next


@require_GET
@viewer_required
def audit_csv(request: ConsoleRequest) -> HttpResponseBase:
    """Every entry matching the filters, newest first, read in keyset chunks of CSV_CHUNK so
    that no row limit is needed and no long-lived cursor is held. Under ASGI (daphne) the
    body is an async iterator, so it streams there too instead of being collected first."""
    form = AuditFilterForm({k: v for k, v in request.GET.items() if k in AuditFilterForm.FILTERS})
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return HttpResponse(f"invalid filters: {errors}", status=400, content_type="text/plain; charset=utf-8")
    filters = form.filters()
    user = request.user
    rows = follow(_rows_sync(filters, user))  # from the standby, as the page, if the page is
    body = async_parts(rows) if isinstance(request, ASGIRequest) else rows
    response = StreamingHttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response

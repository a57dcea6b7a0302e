"""The audit log page and its CSV export. Read-only: nothing here writes, and the table refuses
UPDATE and DELETE in the database as well."""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET

from console import live, selectors
from console.models import AuditEntry, AuditOutcome
from console.templatetags.console_tags import redact
from console.views.base import live_context, viewer_required

AUDIT_FRAGMENT = "audit_log"
CSV_CHUNK = 2000
CSV_HEADER = ["created_at", "actor", "action", "object_type", "object_id", "outcome", "reason", "message",
              "before", "after", "ip"]
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=200)
    action = forms.CharField(required=False, max_length=60)
    object_type = forms.CharField(required=False, max_length=60)
    object_id = forms.CharField(required=False, max_length=100)
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), *AuditOutcome.choices])
    since = forms.DateTimeField(required=False, label="from (UTC)")
    until = forms.DateTimeField(required=False, label="before (UTC)")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since >= until:
            raise forms.ValidationError("the start of the time range must be before its end")
        return data

    def filters(self) -> selectors.AuditFilters:
        d = self.cleaned_data
        return selectors.AuditFilters(
            actor=d["actor"].strip(), action=d["action"].strip(), object_type=d["object_type"].strip(),
            object_id=d["object_id"].strip(), outcome=d["outcome"], since=d["since"], until=d["until"],
        )


FILTER_FIELDS = tuple(AuditFilterForm.base_fields)


def _query(params: dict[str, str]) -> dict[str, str]:
    """The filters that are set, to carry into pager and CSV links."""
    return {k: params[k] for k in FILTER_FIELDS if params.get(k)}


def _audit_context(user: AbstractBaseUser, params: dict[str, str]) -> dict[str, Any]:
    form = AuditFilterForm(_query(params))
    cursor = params.get("after") or ""
    context: dict[str, Any] = {"form": form, "cursor": cursor, "known": selectors.audit_known_values(),
                               "filter_qs": urlencode(_query(params)), "page": None}
    if form.is_valid():
        context["page"] = selectors.audit_page(form.filters(), cursor=cursor or None)
    return context


@live.fragment(AUDIT_FRAGMENT)
def audit_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    try:
        context = _audit_context(user, params)
    except selectors.BadCursor:
        context = _audit_context(user, {k: v for k, v in params.items() if k != "after"})
    return render_to_string("console/audit_live.html", context)


@require_GET
@viewer_required
def audit_log(request: HttpRequest) -> HttpResponse:
    params = {k: request.GET.get(k, "") for k in (*FILTER_FIELDS, "after")}
    try:
        context = _audit_context(request.user, params)
    except selectors.BadCursor as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    context.update(live_context([AUDIT_FRAGMENT], **_query(params), after=params["after"]))
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
        _cell(entry.object_id), entry.outcome, _cell(entry.reason), _cell(entry.message),
        _cell(_payload(entry.before)), _cell(_payload(entry.after)), entry.ip or "",
    ]


def _rows_sync(filters: selectors.AuditFilters) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    cursor = None
    while True:
        page = selectors.audit_page(filters, cursor=cursor, size=CSV_CHUNK)
        for entry in page.items:
            yield writer.writerow(csv_row(entry))
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _rows_async(filters: selectors.AuditFilters) -> AsyncIterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    cursor = None
    while True:
        page = await sync_to_async(selectors.audit_page)(filters, cursor=cursor, size=CSV_CHUNK)
        for entry in page.items:
            yield writer.writerow(csv_row(entry))
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@require_GET
@viewer_required
def audit_csv(request: HttpRequest) -> HttpResponse:
    """Every entry matching the filters, newest first, read in keyset chunks of CSV_CHUNK so
    that no row limit is needed and no long-lived cursor is held. Under ASGI (daphne) the
    body is an async iterator, so it streams there too instead of being collected first."""
    form = AuditFilterForm(_query({k: request.GET.get(k, "") for k in FILTER_FIELDS}))
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return HttpResponse(f"invalid filters: {errors}", status=400, content_type="text/plain; charset=utf-8")
    filters = form.filters()
    body = _rows_async(filters) if isinstance(request, ASGIRequest) else _rows_sync(filters)
    response = StreamingHttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response

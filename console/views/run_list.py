"""The runs list: filters parsed from the query string, keyset pages, and its live region.

The list is one live fragment (``console.live``), ``runs_table``: the function registered
below renders ``runs_table.html`` for the full page, the htmx swap and the websocket push
alike. Every filter is validated here; a bad one is shown next to the form with what was
typed, and the list is not queried with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.views.decorators.http import require_GET

from console import live, selectors
from console.views.base import live_context, viewer_required
from sagas.models import RunStatus

RUNS_TABLE = "runs_table"
FILTER_PARAMS = ("q", "status", "workflow", "version", "tenant", "from", "to")
MAX_FILTER_CHARS = 200


@dataclass
class RunsQuery:
    """The runs list's query string, parsed. ``values`` refill the form and build the links."""

    values: dict[str, str]
    filters: selectors.RunFilters
    cursor: str = ""
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def link_params(self, **extra: str) -> dict[str, str]:
        return {**{k: v for k, v in self.values.items() if v}, **extra}


def _quoted(text: str) -> str:
    return f"“{text[:80]}{'…' if len(text) > 80 else ''}”"


def _parse_when(text: str, *, label: str, end: bool, errors: list[str]) -> datetime | None:
    """A date (the whole day: its start for ``from``, the next day's start for ``to``) or a date
    and time, in the server's time zone unless it names one."""
    if not text:
        return None
    try:
        day = parse_date(text)
        if day is not None:
            start = timezone.make_aware(datetime.combine(day, datetime.min.time()))
            return start + timedelta(days=1) if end else start
        moment = parse_datetime(text)
    except ValueError:  # well formed but impossible, such as 2026-13-40
        moment = None
    if moment is None:
        errors.append(f"{label}: {_quoted(text)} is not a date or a time; write 2026-11-29 or 2026-11-29T14:30.")
        return None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def parse_runs_query(params: Mapping[str, str]) -> RunsQuery:
    """Parse the list's filters. Malformed ones become messages in ``errors`` (and the list shows
    nothing until they are fixed, rather than something the user did not ask for)."""
    values = {key: str(params.get(key) or "").strip() for key in FILTER_PARAMS}
    errors: list[str] = []
    notes: list[str] = []
    for key, label in (("q", "Search"), ("workflow", "Workflow"), ("tenant", "Tenant")):
        if len(values[key]) > MAX_FILTER_CHARS:
            errors.append(f"{label} is longer than {MAX_FILTER_CHARS} characters.")
    status = values["status"]
    if status and status not in RunStatus.values:
        errors.append(f"Status: {_quoted(status)} is not a run status; choose one of {', '.join(RunStatus.values)}.")
    version = None
    if values["version"]:
        try:
            version = int(values["version"])
            if version < 1:
                raise ValueError
        except ValueError:
            errors.append(f"Version: {_quoted(values['version'])} is not a version number (1, 2, 3 …).")
            version = None
        else:
            if not values["workflow"]:
                errors.append("Version: choose a workflow too; version numbers belong to a workflow.")
    created_from = _parse_when(values["from"], label="Created from", end=False, errors=errors)
    created_to = _parse_when(values["to"], label="Created to", end=True, errors=errors)
    if created_from and created_to and created_from >= created_to:
        errors.append("Created from must be before created to.")
    search = values["q"]
    if search and _looks_like_a_whole_run_id(search):
        try:
            uuid.UUID(search)
        except ValueError:
            notes.append(f"{_quoted(search)} is not a valid run id; it is searched as a business key prefix.")
    cursor = str(params.get("after") or "").strip()
    if cursor:
        try:
            selectors.decode_run_cursor(cursor)
        except selectors.BadRunCursor:
            notes.append("The page link was damaged (its cursor is not one this page makes); showing the first page.")
            cursor = ""
    filters = selectors.RunFilters(
        status=status if status in RunStatus.values else "", workflow=values["workflow"], version=version,
        tenant=values["tenant"], created_from=created_from, created_to=created_to, search=search,
    )
    return RunsQuery(values=values, filters=filters, cursor=cursor, errors=errors, notes=notes)


def _looks_like_a_whole_run_id(text: str) -> bool:
    bare = text.replace("-", "")
    return len(bare) >= 32 and text.count("-") in (0, 4) and all(c.isalnum() for c in bare)


def _runs_table_context(params: Mapping[str, str]) -> dict[str, Any]:
    query = parse_runs_query(params)
    page = None if query.errors else selectors.runs_page(query.filters, cursor=query.cursor or None)
    base = reverse("console:runs")
    return {
        "query": query,
        "page": page,
        "next_url": f"{base}?{urlencode(query.link_params(after=page.next_cursor))}"
        if page and page.next_cursor else "",
        "first_url": (f"{base}?{urlencode(query.link_params())}" if query.link_params() else base)
        if query.cursor else "",
    }


@live.fragment(RUNS_TABLE)
def runs_table_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    return render_to_string("console/runs_table.html", _runs_table_context(params))


@require_GET
@viewer_required
def runs_list(request: HttpRequest) -> HttpResponse:
    context = _runs_table_context(request.GET)
    query: RunsQuery = context["query"]
    context.update(statuses=RunStatus.values, workflow_names=selectors.workflow_names())
    context.update(live_context([RUNS_TABLE], **query.link_params(after=query.cursor)))
    return render(request, "console/runs.html", context)

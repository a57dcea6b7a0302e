"""The runs list: filters validated by ``console.forms.RunFilterForm``, keyset pages, and its
live region ``runs_table`` (``runs_table.html``, for the full page, the htmx swap and the
websocket push alike). A bad filter is shown next to the form with what was typed, the
list is not queried with it, and the answer is a 400 (bad input is never a 200 or a 500).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET

from console.forms import RunFilterForm
from console.views.base import ConsoleRequest, live_context, viewer_required
from operators import roles
from operators.selectors.runs import runs_page, workflow_names
from sagas.models import RunStatus

RUNS_TABLE = "runs_table"


def _runs_table_context(user: User, params: Mapping[str, str]) -> dict[str, Any]:
    form = RunFilterForm(params)
    filters = form.filters() if form.is_valid() else None
    page = runs_page(filters, user=user, cursor=form.cursor) if filters is not None else None
    cursor = form.cursor_text
    base = reverse("console:runs")
    return {
        "query": form,
        "page": page,
        "parent_id": filters.parent if filters is not None else "",
        "next_url": f"{base}?{urlencode(form.link_params(after=page.next_cursor))}"
        if page and page.next_cursor else "",
        "first_url": (f"{base}?{urlencode(form.link_params())}" if form.link_params() else base) if cursor else "",
        # Rows get a checkbox for the bulk bar (console/templatetags/bulk.py) when a bulk action is allowed.
        "can_bulk": roles.can(user, "run.cancel") or roles.can(user, "run.retry"),
    }


def runs_table_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/runs_table.html", _runs_table_context(user, params))


@require_GET
@viewer_required
def runs_list(request: ConsoleRequest) -> HttpResponse:
    context = _runs_table_context(request.user, request.GET)
    form: RunFilterForm = context["query"]
    context.update(statuses=RunStatus.values, workflow_names=workflow_names())
    context.update(live_context([RUNS_TABLE], **form.link_params(after=form.cursor_text)))
    return render(request, "console/runs.html", context, status=200 if context["page"] is not None else 400)

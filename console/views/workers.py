"""The workers page (live region ``workers_list``): the worker registry, what each worker carries
and holds now, and stranded versions.

Live twice over: the region follows the ``runs`` topic (a claim, a hand-back or a finish changes
the runs held and the stranded counts), and polls itself every 5 s (htmx ``every 5s``), because
a heartbeat, a worker starting or going silent publishes nothing."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.selectors.workers import workers_page
from console.views.base import ConsoleRequest, live_context, viewer_required

WORKERS_FRAGMENT = "workers_list"


def _workers_context(user: User, params: dict[str, str]) -> dict[str, Any]:
    return {"page": workers_page(user=user)}


def workers_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/workers_live.html", _workers_context(user, params))


@require_GET
@viewer_required
def workers(request: ConsoleRequest) -> HttpResponse:
    if request.htmx:  # the region's own poll
        return HttpResponse(workers_fragment(request.user, {}))
    context = _workers_context(request.user, {})
    context.update(live_context([WORKERS_FRAGMENT]))
    return render(request, "console/workers.html", context)

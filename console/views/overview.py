"""The overview page and its live region (``overview``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.selectors.overview import overview as overview_data
from console.views.base import live_context, viewer_required

OVERVIEW = "overview"


@require_GET
@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {"overview": overview_data(user=request.user)}
    context.update(live_context([OVERVIEW]))
    return render(request, "console/overview.html", context)


def overview_fragment(user: AbstractBaseUser, params: dict[str, str]) -> str:
    return render_to_string("console/overview_live.html", {"overview": overview_data(user=user), "user": user})

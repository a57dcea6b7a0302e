"""Shared view helpers (role checks, object access, the actor) and the overview page."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console import live, roles, selectors
from console.services import Actor
from sagas.models import WorkflowRun


def viewer_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login, then any console role (viewer, operator, approver) to read pages."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not roles.can_view(request.user):
            raise PermissionDenied("your account has no console role")
        return view(request, *args, **kwargs)

    return wrapped


def actor_of(request: HttpRequest) -> Actor:
    return Actor(user=request.user, ip=request.META.get("REMOTE_ADDR"))


def get_run_for_user(request: HttpRequest, run_id: Any) -> WorkflowRun:
    """The run, or 404 for an unknown or malformed id. (Every role may read every run.)"""
    try:
        return WorkflowRun.objects.get(id=run_id)
    except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
        raise Http404("no such run") from exc


def live_context(fragments: list[str], **params: Any) -> dict[str, Any]:
    """Template context that makes the page subscribe to live updates of ``fragments``."""
    query = urlencode({"fragments": ",".join(fragments), **{k: v for k, v in params.items() if v not in (None, "")}})
    return {"live_fragments": fragments, "live_query": query}


@require_GET
@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    context = {"overview": selectors.overview()}
    context.update(live_context(["overview"]))
    return render(request, "console/overview.html", context)


@live.fragment("overview")
def _overview_fragment(user: Any, params: dict[str, str]) -> str:
    return render_to_string("console/overview_live.html", {"overview": selectors.overview(), "user": user})

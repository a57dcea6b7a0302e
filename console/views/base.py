"""Shared view helpers: role checks, object access, the actor, and the live-page context."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse

from console import roles
from console.selectors.runs import run_get
from console.services.actions import Actor
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
    run = run_get(run_id)
    if run is None:
        raise Http404("no such run")
    return run


def live_context(fragments: list[str], **params: Any) -> dict[str, Any]:
    """Template context that makes the page subscribe to live updates of ``fragments``."""
    query = urlencode({"fragments": ",".join(fragments), **{k: v for k, v in params.items() if v not in (None, "")}})
    return {"live_fragments": fragments, "live_query": query}

"""Shared view helpers: role checks, object access, the actor, and the live-page context."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

from console.forms import ActionForm
from core.replica import AFTER_WRITE_COOKIE, page_on_replica
from ledger.models import EffectRecord
from operators import roles
from operators.selectors.runs import run_get
from operators.selectors.tenancy import scoped_get
from operators.services.actions import Actor, audit_denied
from operators.services.tenancy import check_tenant
from sagas.models import ApprovalRequest, WorkflowRun

M = TypeVar("M", bound=Model)


class ConsoleRequest(HttpRequest):
    """The request a console view is handed, as the type checker sees it (at run time it is
    Django's own): ``login_required`` has run, so ``user`` is a logged-in User, and
    django-htmx's middleware has set ``htmx``."""

    user: User
    htmx: HtmxDetails


def viewer_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Login, then any console role (viewer, operator, approver) to read pages. A GET or HEAD
    page reads from the standby when one is configured and up, unless this browser has just
    acted (core/replica.py); the session, the user and their roles are read from the primary
    before that."""

    @login_required
    @wraps(view)
    def wrapped(request: ConsoleRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not roles.can_view(request.user):
            raise PermissionDenied("your account has no console role")
        if request.method in ("GET", "HEAD"):
            return page_on_replica(lambda: view(request, *args, **kwargs),
                                   after_write=AFTER_WRITE_COOKIE in request.COOKIES)
        return view(request, *args, **kwargs)

    return wrapped


def action_view(action: str | Callable[[ConsoleRequest], str], object_type: str, *, id_kwarg: str,
                text: str = "reason") -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """``viewer_required`` for an action's view: someone with no console role at all is turned
    away the same way (403), and a POST of theirs is audited as denied, whatever it carried, like
    any other role's (``action``: the action, or how to tell it from the request; ``id_kwarg``:
    the URL's id of the object, or else the form field that names it; ``text``: the form field
    whose text the audit entry keeps)."""

    def decorate(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @login_required
        @wraps(view)
        def wrapped(request: ConsoleRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not roles.can_view(request.user):
                if request.method == "POST":
                    name = action(request) if callable(action) else action
                    object_id = kwargs.get(id_kwarg, str(request.POST.get(id_kwarg, ""))[:100])
                    audit_denied(actor_of(request), name, object_type, object_id,
                                 reason=str(request.POST.get(text, "")))
                raise PermissionDenied("your account has no console role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def actor_of(request: ConsoleRequest) -> Actor:
    return Actor(user=request.user, ip=request.META.get("REMOTE_ADDR"))


def get_run_for_user(request: ConsoleRequest, run_id: Any, *, action: str = "") -> WorkflowRun:
    """The run, or 404 for an unknown or malformed id and for a run outside the user's tenants
    (404, not 403: the answer does not say it exists). ``action``: the page is an action's, and
    an attempt on another tenant's run is audited as denied (operators/services/tenancy.py)."""
    run = run_get(run_id, user=request.user)
    if run is None:
        if action:
            check_tenant(actor_of(request), action, "run", run_id)
        raise Http404("no such run")
    return run


def get_effect_for_user(request: ConsoleRequest, effect_id: int, *, action: str) -> EffectRecord:
    """The effect an action is about, or 404 (unknown, or outside the user's tenants: audited)."""
    return _get_for_user(request, EffectRecord.objects.all(), "effect", effect_id, action=action)


def get_approval_for_user(request: ConsoleRequest, approval_id: int, *, action: str) -> ApprovalRequest:
    """The approval an action is about, or 404 (unknown, or outside the user's tenants: audited)."""
    return _get_for_user(request, ApprovalRequest.objects.all(), "approval", approval_id, action=action,
                         field="run__tenant")


def _get_for_user(request: ConsoleRequest, qs: QuerySet[M], object_type: str, object_id: int, *, action: str,
                  field: str = "tenant") -> M:
    """One scoped query; only on a miss is the tenant looked up, to audit an attempt outside them."""
    found = scoped_get(qs, request.user, object_id, field=field)
    if found is None:
        check_tenant(actor_of(request), action, object_type, object_id)
        raise Http404(f"no such {object_type}")
    return found


def action_input(request: ConsoleRequest, form_class: type[ActionForm], action: str) -> tuple[dict[str, Any], str]:
    """An action's form values, and what is wrong with them ("" when nothing is).

    The role comes first: for someone whose role does not allow ``action`` the values are
    returned as sent (stripped) and never called wrong, so the service denies and audits the
    attempt whatever was typed (the audit entry stores it clipped, ``clip_text``). For someone
    allowed, an invalid form is answered 400 before anything is attempted or stored."""
    form = form_class(request.POST)
    if not roles.can(request.user, action):
        return {name: str(request.POST.get(name, "")).strip() for name in form.fields}, ""
    if not form.is_valid():
        return {}, " ".join(form.problems())
    return form.cleaned_data, ""


def bad_request(request: ConsoleRequest, message: str, *, title: str = "Bad request") -> HttpResponse:
    """A 400 that says what is wrong (escaped like any text): a page in the console's layout, or
    just the message for htmx."""
    template = "console/error_message.html" if request.htmx else "console/error.html"
    return render(request, template, {"title": title, "message": message}, status=400)


def live_context(fragments: list[str], **params: Any) -> dict[str, Any]:
    """Template context that makes the page subscribe to live updates of ``fragments``."""
    query = urlencode({"fragments": ",".join(fragments), **{k: v for k, v in params.items() if v not in (None, "")}})
    return {"live_fragments": fragments, "live_query": query}

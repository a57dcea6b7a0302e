"""The JSON API, ``/api/v1/`` (django-ninja): the same services, role checks and audit as the
console, for the programs around it. OpenAPI at ``/api/v1/openapi.json`` for staff and for
any active API key (a client generator needs it); interactive docs at ``/api/v1/docs`` for staff.
Each group of endpoints is a router in ``api/routes/``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger

from api.auth import ApiKeyAuth
from api.errors import Problem, problem_response
from api.keys import apikey_check
from core.storage import is_storage_error


def _staff_or_api_key(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The docs for staff (a person's session); the OpenAPI document also for an active API key."""
    staff_view = staff_member_required(view)

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        header = request.headers.get("Authorization", "")
        if request.path.endswith("/openapi.json") and header.startswith("Bearer "):
            if apikey_check(header[len("Bearer "):].strip()) is not None:
                return view(request, *args, **kwargs)
            return problem_response(request, "unauthenticated", "the API key is not valid (or no longer active)")
        return staff_view(request, *args, **kwargs)

    return wrapped


class LocalSwagger(Swagger):
    """ninja's Swagger page from its own template and static files (settings.NINJA_ASSETS).

    ninja renders that template only when "ninja" is an installed app, and otherwise a variant
    that loads Swagger UI from a CDN, which our pages never do. It is not an installed app
    (see config/settings.py), so this page renders the local template itself, with the context
    ninja's page gives it."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        auths = api.auth if isinstance(api.auth, Sequence) else ()
        context = {"swagger_settings": json.dumps(self.settings, indent=1), "api": api,
                   "add_csrf": any(getattr(auth, "csrf", False) for auth in auths)}
        return render(request, self.template, context)


api = NinjaAPI(
    title="Saga Console API", version="1", urls_namespace="api", auth=ApiKeyAuth(),
    docs=LocalSwagger(), docs_decorator=_staff_or_api_key,
    description="Start, follow, signal and decide runs; pause connectors and set their limits and the tenants' "
                "daily spend limits. "
                "Authenticate with `Authorization: Bearer sk_...` "
                "(manage.py createapikey). Errors are RFC 9457 problem JSON.",
)


@api.exception_handler(Problem)
def _problem(request: HttpRequest, exc: Problem) -> HttpResponse:
    return problem_response(request, exc.kind, exc.detail, **exc.extra)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))[:300]} for e in exc.errors]
    return problem_response(request, "validation", "the request does not match the schema", errors=errors[:20])


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return problem_response(request, "unauthenticated",
                            "send an active API key as 'Authorization: Bearer sk_...' (manage.py createapikey)")


@api.exception_handler(Http404)
@api.exception_handler(ObjectDoesNotExist)
def _not_found(request: HttpRequest, exc: Exception) -> HttpResponse:
    return problem_response(request, "not-found", str(exc) or "no such object")


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: Exception) -> HttpResponse:
    return problem_response(request, "forbidden", str(exc) or "not allowed")


@api.exception_handler(RequestDataTooBig)
def _too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    """Django refuses to read a body over DATA_UPLOAD_MAX_MEMORY_SIZE: the caller's 413, not our 500."""
    return problem_response(request, "payload-too-large",
                            f"a request body may hold at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    kind = {400: "validation", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
            413: "payload-too-large", 429: "rate-limited"}.get(exc.status_code, "conflict")
    return problem_response(request, kind, str(exc))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Our storage failing is a 503 to retry, never the caller's fault; anything else is logged
    with its trace and answered without it."""
    if is_storage_error(exc):
        return problem_response(request, "unavailable", "the database or Redis is unavailable; retry later")
    import logging

    logging.getLogger("api").exception("unexpected error on %s %s", request.method, request.path)
    return problem_response(request, "internal", "an unexpected error; it was logged (a bug: please report it)")


def _routers() -> None:
    from api.routes import approvals, connectors, effects, hooks, run_read, runs, schedules, spend_limits, workflows

    api.add_router("/runs", runs.router)
    api.add_router("/runs", run_read.router)  # GET /runs/{id} (?wait=): its own module
    api.add_router("/approvals", approvals.router)
    api.add_router("/effects", effects.router)
    api.add_router("/hooks", hooks.router)
    api.add_router("/workflows", workflows.router)
    api.add_router("/schedules", schedules.router)
    api.add_router("/connectors", connectors.router)
    api.add_router("/spend-limits", spend_limits.router)


_routers()

"""The JSON API, ``/api/v1/`` (django-ninja): the same services, role checks and audit as the
console, for the programs around it. OpenAPI at ``/api/v1/openapi.json`` and interactive docs at
``/api/v1/docs``, readable without a key (they hold no data); each problem ``type`` at
``/api/v1/problems/<type>``.
Each group of endpoints is a router in ``api/routes/``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger

from api.auth import ApiKeyAuth
from api.errors import Problem, problem_response
from core.storage import is_storage_error
from operators.services.dual_rules import ConfirmationNeeded


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


def _problem_ref(description: str, **headers: dict[str, Any]) -> dict[str, Any]:
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    answer: dict[str, Any] = {"description": description, "content": {"application/problem+json": problem}}
    if headers:
        answer["headers"] = headers
    return answer


PROBLEM_SCHEMA = {
    "title": "Problem", "type": "object", "required": ["type", "title", "status", "detail"],
    "description": "RFC 9457 problem details; `type` leads to a page that says what it means.",
    "properties": {
        "type": {"type": "string", "description": "/api/v1/problems/<kind>"},
        "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object"}, "description": "validation: where and what"},
        "retry_after": {"type": "integer", "description": "rate-limited: seconds until the window ends"},
    },
    "additionalProperties": True,
}


class SagaApi(NinjaAPI):
    """ninja's OpenAPI document, with the errors each operation can answer (problem JSON) and the
    headers the server reads or sets, so a generated client knows them too."""

    def get_openapi_schema(self, *, path_prefix: str | None = None,
                           path_params: dict[str, Any] | None = None) -> Any:
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = schema["components"].setdefault("schemas", {})
        components["Problem"] = PROBLEM_SCHEMA
        for body in components.values():
            # The server refuses an action without `expected` (400, after its role check and audit,
            # so a refused attempt is still logged as such): the document says it is required.
            if "expected" in body.get("properties", {}):
                body["properties"]["expected"].pop("default", None)
                body["properties"]["expected"]["minLength"] = 1
                body["required"] = sorted({*body.get("required", []), "expected"})
        for path, operations in schema["paths"].items():
            for method, op in operations.items():
                _document_errors(path, method.upper(), op, components)
        return schema


# The operations a dual-control rule may cover (their last path segment, POST).
DUAL_CONTROLLED = frozenset({"cancel", "compensate", "pause", "move", "redrive", "fork", "resolve"})


def _body_names_workflow(op: dict[str, Any], components: dict[str, Any]) -> bool:
    """Whether the operation's JSON body has a ``workflow`` (one this process may not have)."""
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if "$ref" in body:
        body = components.get(body["$ref"].rsplit("/", 1)[-1], {})
    return "workflow" in body.get("properties", {})


def _document_errors(path: str, method: str, op: dict[str, Any], components: dict[str, Any]) -> None:
    responses = op.setdefault("responses", {})
    problems = {"500": "an unexpected error (logged)", "503": "our database or Redis cannot answer now; retry"}
    if op.get("parameters") or op.get("requestBody"):
        problems["400"] = "a parameter or the body does not match the schema"
    if "{" in path:
        problems["404"] = "no such object (or not in your key's tenant)"
    elif _body_names_workflow(op, components):
        problems["404"] = "no such workflow (or version) is registered"
    if op.get("security"):
        problems["401"] = "no valid API key"
        problems["403"] = "the key's role or tenant does not allow this"
    if method in ("POST", "PUT", "PATCH", "DELETE"):
        problems["409"] = "not possible in the object's current state, or not the state you expected"
    if op.get("requestBody"):
        problems["413"] = "the body is too large"
        problems["415"] = "the body is not application/json"
    for code, description in problems.items():
        responses.setdefault(code, _problem_ref(description))
    if op.get("security"):
        responses.setdefault("429", _problem_ref(
            "too many requests for this key this minute",
            **{"Retry-After": {"description": "seconds until the window ends", "schema": {"type": "integer"}}}))
    if method == "POST" and path.rsplit("/", 1)[-1] in DUAL_CONTROLLED and ("/runs/{" in path or "/effects/{" in path):
        responses.setdefault("202", {
            "description": "dual control: a SAGA_DUAL_CONTROL rule covers this action; it was checked and stored, "
                           "not done, until another person confirms it (POST /api/v1/dual-control/{id}/confirm)",
            "content": {"application/json": {"schema": {
                "type": "object", "required": ["message", "dual_control"],
                "properties": {"message": {"type": "string"},
                               "dual_control": {"$ref": "#/components/schemas/DualOut"}}}}}})
    if path.rstrip("/").endswith("/runs") and method == "POST":
        params = op.setdefault("parameters", [])
        if not any(p.get("name") == "Idempotency-Key" for p in params):
            params.append({"name": "Idempotency-Key", "in": "header", "required": False,
                           "description": "the run's business key: the same key with the same input answers the "
                                          "same run (200); with another input, 409",
                           "schema": {"type": "string", "maxLength": 200}})


api = SagaApi(
    title="Saga Console API", version="1", urls_namespace="api", auth=ApiKeyAuth(),
    # The schema and its docs page hold no data: readable without a key, as a client generator needs.
    docs=LocalSwagger(),
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
    # The detail names the fields, so a person reading only it knows what to fix (errors[] has all).
    said = "; ".join(f"{e['loc'][-1] if e['loc'] else 'body'}: {e['msg']}" for e in errors[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return problem_response(request, "validation", f"the request does not match the schema: {said}{more}",
                            errors=errors[:20])


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


@api.exception_handler(ConfirmationNeeded)
def _awaiting_confirmation(request: HttpRequest, exc: ConfirmationNeeded) -> HttpResponse:
    """Dual control: the action was checked and stored, not done; a second person confirms it
    (``POST /api/v1/dual-control/{id}/confirm``)."""
    from api.routes.dual import dual_out

    return JsonResponse({"message": str(exc), "dual_control": dual_out(exc.request)}, status=202)


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
    from api.routes import (
        approvals,
        connectors,
        dual,
        effects,
        hooks,
        problems,
        run_read,
        runs,
        schedules,
        spend_limits,
        workflows,
    )

    api.add_router("/runs", runs.router)
    api.add_router("/runs", run_read.router)  # GET /runs/{id} (?wait=): its own module
    api.add_router("/approvals", approvals.router)
    api.add_router("/effects", effects.router)
    api.add_router("/hooks", hooks.router)
    api.add_router("/workflows", workflows.router)
    api.add_router("/schedules", schedules.router)
    api.add_router("/connectors", connectors.router)
    api.add_router("/spend-limits", spend_limits.router)
    api.add_router("/problems", problems.router)
    api.add_router("/dual-control", dual.router)


_routers()

"""The edges of ``/api/v1/``: every answer there is problem JSON, including what never reaches
an operation (an unknown path, a method a path does not take), and a request body is JSON only.

``ApiEdgesMiddleware`` (config/settings.py): before the view, a body that is not
``application/json`` (or ``+json``) is refused with 415; after it, a 404 or 405 that is not
already problem JSON (Django's HTML pages, ninja's plain 405) becomes one, with its ``Allow``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from api.errors import problem_response

PREFIX = "/api/v1/"
PROBLEM_JSON = "application/problem+json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class ApiEdgesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(PREFIX):
            return self.get_response(request)
        if request.method in BODY_METHODS and _has_body(request) and not _is_json(request.content_type or ""):
            return problem_response(request, "unsupported-media-type",
                                    f"the body was sent as {request.content_type or 'nothing named'!r}; "
                                    f"send it as application/json")
        response = self.get_response(request)
        if response.status_code in (404, 405) and not response.get("Content-Type", "").startswith(PROBLEM_JSON):
            if response.status_code == 404:
                return problem_response(request, "not-found", f"no such path: {request.path}")
            answer = problem_response(request, "method-not-allowed",
                                      f"{request.path} does not take {request.method}")
            if response.has_header("Allow"):
                answer["Allow"] = response["Allow"]
            return answer
        return response


def _has_body(request: HttpRequest) -> bool:
    length = request.META.get("CONTENT_LENGTH") or ""
    return (length.isdigit() and int(length) > 0) or "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "")

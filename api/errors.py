"""Errors as RFC 9457 problem JSON (``application/problem+json``), one stable ``type`` each.

Every error the API answers is one of ``PROBLEMS``: never an HTML page, never a 500 with a
trace. ``type`` is a URI under ``/api/v1/problems/`` that never changes meaning; ``title`` is
its fixed summary; ``detail`` says what happened this time.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

PROBLEM_BASE = "/api/v1/problems/"
# type -> (status, title)
PROBLEMS: dict[str, tuple[int, str]] = {
    "validation": (400, "The request is not valid"),
    "unauthenticated": (401, "No valid API key"),
    "forbidden": (403, "The key's role does not allow this"),
    "not-found": (404, "No such object"),
    "unknown-workflow": (404, "No such workflow"),
    "start-conflict": (409, "A run with this key exists with other input"),
    "stale-state": (409, "The object is not in the state you expected"),
    "conflict": (409, "Not possible in the object's current state"),
    "four-eyes": (409, "The person who started the run cannot decide its approvals"),
    "budget": (409, "A budget does not allow this"),
    "payload-too-large": (413, "The request body is too large"),
    "rate-limited": (429, "Too many requests for this key"),
    "signature": (401, "The webhook signature is not valid"),
    "replay": (409, "This webhook delivery was accepted before"),
    "unavailable": (503, "The service cannot answer now"),
    "internal": (500, "An unexpected error"),
}


class Problem(Exception):
    """Raise anywhere in the API: answered as problem JSON of ``kind`` with ``detail``."""

    def __init__(self, kind: str, detail: str, **extra: Any) -> None:
        if kind not in PROBLEMS:
            raise ValueError(f"unknown problem type {kind!r}")
        super().__init__(detail)
        self.kind, self.detail, self.extra = kind, detail, extra


def problem_response(request: HttpRequest | None, kind: str, detail: str, **extra: Any) -> HttpResponse:
    status, title = PROBLEMS[kind]
    body = {"type": f"{PROBLEM_BASE}{kind}", "title": title, "status": status, "detail": detail, **extra}
    if request is not None:
        body.setdefault("instance", request.path)
    response = JsonResponse(body, status=status, content_type="application/problem+json")
    if kind == "unauthenticated":
        response["WWW-Authenticate"] = 'Bearer realm="saga-console"'
    return response

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
    "second-person": (403, "Another person must confirm this"),
    "method-not-allowed": (405, "This path does not take this method"),
    "payload-too-large": (413, "The request body is too large"),
    "unsupported-media-type": (415, "The request body must be JSON (Content-Type: application/json)"),
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
    if kind == "rate-limited" and isinstance(extra.get("retry_after"), int):
        response["Retry-After"] = str(max(1, extra["retry_after"]))  # RFC 9110: seconds
    return response


# What each problem means and what to do about it: the page its ``type`` URI leads to.
PROBLEM_HELP: dict[str, str] = {
    "validation": "A parameter or the body does not match the operation's schema (see `errors`: where and what). "
                  "Fix the request; sending it again unchanged fails again.",
    "unauthenticated": "No API key, or one that is not valid or no longer active. Send "
                       "`Authorization: Bearer sk_...` (keys are made with `manage.py createapikey`).",
    "forbidden": "The key's role (or tenant) does not allow this action on this object.",
    "not-found": "No such object, or none your key's tenant can see; or no such path under /api/v1/.",
    "unknown-workflow": "No workflow of that name (or version) is registered.",
    "start-conflict": "A run with this business key (the Idempotency-Key) exists with another input or version: "
                      "nothing was started. Use a new key for a new run.",
    "stale-state": "The object is not in the state you said you saw (`expected`): someone or something acted "
                   "first. Read it again, then decide.",
    "conflict": "The object's current state does not allow this action (for example, a finished run).",
    "four-eyes": "The person who started a run cannot decide its approvals: another person must.",
    "second-person": "Dual control: the person (or key) who asked for a dangerous action cannot confirm or refuse "
                     "their own request; another one with the action's role must (withdraw it instead).",
    "budget": "A budget or limit does not allow this.",
    "method-not-allowed": "The path exists but not with this HTTP method; the `Allow` header lists the ones it takes.",
    "payload-too-large": "The request body is larger than the server accepts.",
    "unsupported-media-type": "Request bodies are JSON only: send `Content-Type: application/json`.",
    "rate-limited": "Too many requests for this key in the current minute: wait `Retry-After` seconds "
                    "(also `retry_after` in the body) and send it again.",
    "signature": "A webhook's signature headers are missing, do not verify against the hook's secret, or carry a "
                 "timestamp more than 5 minutes from our clock; the detail says which.",
    "replay": "A legacy hook's delivery whose signature was accepted before; nothing was done twice. (A Standard "
              "Webhooks delivery whose webhook-id was accepted before is answered 200 with duplicate true.)",
    "unavailable": "Our database or Redis cannot answer now: nothing was decided. Retry later, with the same "
                   "Idempotency-Key where the operation takes one.",
    "internal": "An unexpected error on our side; it was logged. Please report it with the time and `instance`.",
}

"""The demo connectors' HTTP client: JSON over ``urllib``, answers mapped onto the ledger's errors.

The mapping is the contract the ledger relies on to tell "not executed" from "not known":

==========================================  ======================================
what happened                               raised or returned
==========================================  ======================================
2xx                                         the JSON body (a dict)
connection refused; 503                     ``Retryable``: the provider did not act
429 (the provider's rate limit)             ``Throttled`` (a ``Retryable``), with ``Retry-After``
400, 401, 403, 404, 409, 422                ``Final``, with the provider's message
no answer within ``DEMO_PROVIDER_TIMEOUT``  ``Timeout``: the provider may have acted
anything else once the request may be sent  an exception (``UnexpectedResponse``,
                                            ``OSError``...): the outcome is UNKNOWN
==========================================  ======================================

Every request carries ``X-Caller-Pid`` (the fault ``kill_caller_after_work`` uses
it), when given, ``Idempotency-Key``, and with tracing on (``SAGAS_TRACING``) the W3C
``traceparent`` of the effect making it, which the providers log with the request.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings

from ledger import Final, NotExecuted, Outcome, Pending, Retryable, Succeeded, Throttled, Timeout, Unknown
from sagas.integration import trace_headers

FINAL_STATUSES = frozenset({400, 401, 403, 404, 409, 422})
RETRYABLE_STATUSES = frozenset({503})
THROTTLED = 429


class UnexpectedResponse(Exception):
    """An answer the client cannot interpret (a 5xx other than 503, a body that is not JSON).
    The request reached the provider, so whether it acted is not known."""


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any] | None  # None when the body is not a JSON object
    retry_after: float | None = None  # the Retry-After header, in seconds

    @property
    def error(self) -> str:
        return str((self.body or {}).get("error") or f"HTTP {self.status}")


def send(method: str, path: str, body: dict[str, Any] | None = None, *, key: str = "",
         headers: dict[str, str] | None = None) -> Response:
    """One request. Raises ``Retryable`` (refused) or ``Timeout``; returns any HTTP answer as it is."""
    url = settings.DEMO_PROVIDERS_URL.rstrip("/") + path
    timeout = settings.DEMO_PROVIDER_TIMEOUT
    all_headers = {"Accept": "application/json", "X-Caller-Pid": str(os.getpid())}
    if body is not None:
        all_headers["Content-Type"] = "application/json"
    if key:
        all_headers["Idempotency-Key"] = key
    all_headers.update(trace_headers())  # {} with tracing off, or outside an effect
    all_headers.update(headers or {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        answer = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        answer = exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise Retryable(f"{method} {url}: connection refused, nothing was sent") from exc
        if isinstance(exc.reason, TimeoutError):
            raise Timeout(f"{method} {url}: no connection within {timeout:g}s") from exc
        raise
    except TimeoutError as exc:
        raise Timeout(f"{method} {url}: no answer within {timeout:g}s; the provider may have acted") from exc
    try:
        with answer:
            raw = answer.read()
    except TimeoutError as exc:
        raise Timeout(f"{method} {url}: answer cut off after {timeout:g}s; the provider may have acted") from exc
    return Response(answer.code, _json_object(raw), _seconds(answer.headers.get("Retry-After")))


def _seconds(header: str | None) -> float | None:
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None


def call(method: str, path: str, body: dict[str, Any] | None = None, *, key: str = "",
         headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A request whose answer is mapped as in the table above."""
    response = send(method, path, body, key=key, headers=headers)
    if 200 <= response.status < 300:
        if response.body is None:
            raise UnexpectedResponse(f"{method} {path}: HTTP {response.status} with a body that is not a JSON object")
        return response.body
    if response.status == THROTTLED:
        raise Throttled(f"{method} {path}: HTTP 429: {response.error}", retry_after=response.retry_after)
    if response.status in RETRYABLE_STATUSES:
        raise Retryable(f"{method} {path}: HTTP {response.status}: {response.error}")
    if response.status in FINAL_STATUSES:
        raise Final(response.error)
    raise UnexpectedResponse(f"{method} {path}: HTTP {response.status}: {response.error}")


def lookup(prefix: str, key: str, ref_field: str) -> Outcome:
    """Ask a provider's status endpoint about ``key``. Never raises: a failed query is ``Unknown``.

    Only the provider's own answers are evidence: 200 ``succeeded`` (with the
    original response) and 404 ``not_found``. A 404 without that body (a wrong
    URL, say) is not evidence that nothing executed.
    """
    try:
        response = send("GET", prefix + quote(key, safe=""))
    except Exception as exc:  # any failure of the query itself leaves the outcome unknown
        return Unknown(f"status query failed: {type(exc).__name__}: {exc}")
    body = response.body or {}
    if response.status == 200 and body.get("status") == "succeeded" and isinstance(body.get("response"), dict):
        return Succeeded(body["response"], str(body.get(ref_field) or ""))
    if response.status == 200 and body.get("status") == "pending":
        return Pending()
    if response.status == 404 and body.get("status") == "not_found":
        return NotExecuted()
    return Unknown(f"status query answered HTTP {response.status}: {response.error}")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

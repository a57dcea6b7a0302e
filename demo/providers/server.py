"""The providers' HTTP front: JSON in, JSON out, faults applied around the work.

Per request: route, take the fault (``X-Fault`` header, else an injected
``ProviderFault``), apply a before-work fault, run the service (which commits
its execution), apply an after-work fault, answer. So an after-work fault
always acts on committed work, and a before-work fault never executes anything.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from django.db import connections

from demo.providers import faults, limits, services, webhook
from demo.providers.errors import ProviderError
from demo.providers.services import Reply

Call = Callable[[str, dict[str, Any], int | None], Reply]
Action = Callable[..., Reply]

ACTIONS: dict[str, tuple[str, str, Action]] = {
    "/payments/capture": ("payments", "capture", services.payment_capture),
    "/payments/refund": ("payments", "refund", services.payment_refund),
    "/inventory/reserve": ("inventory", "reserve", services.inventory_reserve),
    "/inventory/release": ("inventory", "release", services.inventory_release),
    "/email/send": ("email", "send", services.email_send),
    "/shipping/create": ("shipping", "create", services.shipping_create),
    "/model/complete": ("model", "complete", services.model_complete),
}
STATUS: dict[str, tuple[str, Callable[..., Reply]]] = {
    "/payments/status/": ("payments", services.payment_status),
    "/inventory/status/": ("inventory", services.inventory_status),
    "/shipping/status/": ("shipping", services.shipping_status),
}
MAX_BODY = 1 << 20


WEBHOOK_RECEIVE = "/webhook/receive"
WEBHOOK_PAGE = ("/webhook", "/webhook/")


def resolve(method: str, path: str, raw: bytes = b"", headers: Any = None) -> tuple[str, str, Call]:
    """(provider, operation, call) for a request; ``ProviderError`` 404/405 when there is none.
    The webhook receiver checks a signature over the bytes received: it gets ``raw`` and ``headers``."""
    if path == WEBHOOK_RECEIVE:
        if method != "POST":
            raise ProviderError(405, f"{path} takes POST")
        return "webhook", "receive", lambda key, body, pid: webhook.receive(key=key, raw=raw, headers=headers or {})
    if path in ACTIONS:
        if method != "POST":
            raise ProviderError(405, f"{path} takes POST")
        provider, operation, action = ACTIONS[path]
        return provider, operation, lambda key, body, pid: action(key=key, body=body, caller_pid=pid)
    for prefix, (provider, lookup) in STATUS.items():
        if path.startswith(prefix) and len(path) > len(prefix):
            if method != "GET":
                raise ProviderError(405, f"{prefix}<key> takes GET")
            path_key = unquote(path[len(prefix):])
            return provider, "status", lambda key, body, pid, lookup=lookup, path_key=path_key: lookup(key=path_key)
    raise ProviderError(404, f"no endpoint {method} {path}")


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler asleep in timeout_after_work must not hold up shutdown
    request_queue_size = 128

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, ProviderHandler)
        self._served = itertools.count(1)
        self.requests_served = 0

    def count_request(self) -> None:
        self.requests_served = next(self._served)


class ProviderHandler(BaseHTTPRequestHandler):
    server: ProviderServer
    server_version = "DemoProviders/1.0"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _handle logs one line per request, with the key and the fault

    def _handle(self, method: str) -> None:
        self.server.count_request()
        path = urlsplit(self.path).path
        if method == "GET" and path in WEBHOOK_PAGE:
            self._send_page()
            return
        key = self.headers.get("Idempotency-Key", "").strip()
        spec = self.headers.get("X-Fault", "").strip()
        retry_after: int | None = None
        entered: tuple[str, str] | None = None
        try:
            raw = self._read_body()
            provider, operation, call = resolve(method, path, raw, self.headers)
            spec = spec or faults.take(provider, operation) or ""
            fault = faults.parse(spec) if spec else None
            pid = self._caller_pid(required=fault is not None and fault.name == faults.KILL_CALLER_AFTER_WORK)
            body = _parse_json(raw) if method == "POST" else {}
            if operation != "status":
                limits.enter(provider, operation)
                entered = (provider, operation)
            if fault is not None and fault.before_work:
                _before_work(fault)
            if operation != "status":
                limits.admit(provider, operation)  # the provider's own rate limit: 429 over it
            reply = call(key, body, pid)
        except ProviderError as exc:
            reply = Reply(exc.status, {"error": exc.message})
            retry_after = exc.retry_after
            fault = None
        except Exception as exc:  # a bug or a database outage: the outcome is not known to the caller
            traceback.print_exc()
            reply = Reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
            fault = None
        finally:
            if entered is not None:
                limits.leave(*entered)
            connections.close_all()

        outcome = f"{reply.status}" + (" (replayed)" if reply.replayed else "")
        # The pid is there: _caller_pid refused a request with this fault and none.
        if fault is not None and fault.name == faults.KILL_CALLER_AFTER_WORK and pid is not None:
            self.close_connection = True
            try:
                os.kill(pid, signal.SIGKILL)
                outcome += f", work committed, caller pid {pid} SIGKILLed, no answer"
            except OSError as exc:
                outcome += f", work committed, caller pid {pid} not killed ({exc}), no answer"
            self._log(method, path, key, spec, outcome)
            return
        if fault is not None and fault.name == faults.TIMEOUT_AFTER_WORK:
            self._log(method, path, key, spec, f"{outcome}, work committed, answer held {fault.seconds:g}s")
            time.sleep(fault.seconds)
        else:
            self._log(method, path, key, spec, outcome)
        try:
            self._send(reply, retry_after=retry_after)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up (its timeout) or died; the work stands either way

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ProviderError(400, "Content-Length is not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise ProviderError(400, f"request body must be at most {MAX_BODY} bytes")
        return self.rfile.read(length) if length else b""

    def _caller_pid(self, *, required: bool) -> int | None:
        raw = self.headers.get("X-Caller-Pid", "").strip()
        pid = int(raw) if raw.isdigit() else None
        if required and (pid is None or pid <= 1 or pid == os.getpid()):
            raise ProviderError(400, f"kill_caller_after_work needs a valid X-Caller-Pid header, not {raw!r}")
        return pid

    def _send(self, reply: Reply, *, retry_after: int | None = None) -> None:
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if reply.replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def _send_page(self) -> None:
        """The webhook receiver's page: what arrived (escaped HTML)."""
        try:
            data, status = webhook.arrivals_page(), 200
        except Exception as exc:  # a database outage: say so, do not die
            data, status = f"cannot read the arrivals: {type(exc).__name__}".encode(), 503
        finally:
            connections.close_all()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _log(self, method: str, path: str, key: str, spec: str, outcome: str) -> None:
        # traceparent: the caller's effect span (its trace is the run's), to find the call in tracing.
        traceparent = self.headers.get("traceparent", "").strip()
        extra = (f" key={key!r}" if key else "") + (f" fault={spec}" if spec else "") \
            + (f" traceparent={traceparent!r}" if traceparent else "")
        sys.stderr.write(f"{self.log_date_time_string()} {method} {path}{extra} -> {outcome}\n")


def _before_work(fault: faults.Fault) -> None:
    if fault.name == faults.LATENCY:
        time.sleep(fault.seconds)
    elif fault.name == faults.ERROR_BEFORE_WORK:
        raise ProviderError(503, "service unavailable (injected fault error_before_work); nothing was executed")
    elif fault.name == faults.FINAL:
        raise ProviderError(422, "request refused (injected fault final); nothing was executed")


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise ProviderError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ProviderError(400, "the request body must be a JSON object")
    return body

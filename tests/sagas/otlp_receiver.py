"""A small OTLP/HTTP trace receiver for tests: ``python -m tests.sagas.otlp_receiver <file>``.

It accepts what an OpenTelemetry collector's OTLP/HTTP receiver does on ``POST /v1/traces``
(an ``ExportTraceServiceRequest`` in protobuf, gzip or not), decodes it with
opentelemetry-proto and appends one JSON line per span to ``<file>``: ``trace_id``,
``span_id``, ``parent_span_id`` (hex, "" for a root), ``name``, ``kind``, ``service``,
``attributes``, ``status`` (the status code), ``start`` and ``end`` (ns). It prints
``listening on http://127.0.0.1:<port>`` once it listens (the port is its own pick).
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_write = threading.Lock()


def value_of(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append({
                    "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(), "name": span.name, "kind": span.kind,
                    "service": resource.get("service.name"),
                    "attributes": {a.key: value_of(a.value) for a in span.attributes},
                    "status": span.status.code, "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                })
    return found


class Receiver(BaseHTTPRequestHandler):
    out = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with _write, open(self.out, "a") as out:
            for span in spans_of(request):
                out.write(json.dumps(span) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    Receiver.out = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

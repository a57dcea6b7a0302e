"""The OpenAPI document and the interactive docs: every endpoint of the API with typed schemas,
for staff; the docs page loads only our own static files, so it works under the strict CSP."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from tests.api.conftest import login

pytestmark = pytest.mark.django_db

# Every endpoint the API serves, as "METHOD path".
ENDPOINTS = {
    "POST /api/v1/runs", "GET /api/v1/runs", "GET /api/v1/runs/{run_id}", "GET /api/v1/runs/{run_id}/history",
    "POST /api/v1/runs/{run_id}/signal", "POST /api/v1/runs/{run_id}/cancel",
    "POST /api/v1/runs/{run_id}/compensate", "POST /api/v1/runs/{run_id}/retry",
    "GET /api/v1/approvals", "POST /api/v1/approvals/{approval_id}/decide",
    "GET /api/v1/effects", "POST /api/v1/effects/{effect_id}/resolve", "POST /api/v1/hooks/{name}",
    "POST /api/v1/runs/{run_id}/pause", "POST /api/v1/runs/{run_id}/resume", "POST /api/v1/runs/{run_id}/move",
    "POST /api/v1/runs/{run_id}/redrive", "GET /api/v1/runs/{run_id}/fork", "POST /api/v1/runs/{run_id}/fork",
    "POST /api/v1/workflows/pause", "POST /api/v1/workflows/resume", "GET /api/v1/workflows/pauses",
    "POST /api/v1/workflows/replay-check",
    "GET /api/v1/connectors", "GET /api/v1/connectors/{name}", "POST /api/v1/connectors/{name}/pause",
    "POST /api/v1/connectors/{name}/resume", "PUT /api/v1/connectors/{name}/limits",
    "GET /api/v1/spend-limits", "PUT /api/v1/spend-limits/{tenant}/{connector}",
    "GET /api/v1/schedules", "POST /api/v1/schedules", "GET /api/v1/schedules/{name}",
    "POST /api/v1/schedules/{name}/pause", "POST /api/v1/schedules/{name}/resume",
    "POST /api/v1/schedules/{name}/trigger", "GET /api/v1/schedules/{name}/backfill",
    "POST /api/v1/schedules/{name}/backfill", "POST /api/v1/schedules/{name}/delete",
    "GET /api/v1/dual-control", "POST /api/v1/dual-control/{request_id}/confirm",
    "POST /api/v1/dual-control/{request_id}/refuse", "POST /api/v1/dual-control/{request_id}/withdraw",
}

# The run's own JSON, whatever the workflow makes of it (a schedule's input is its runs'): the
# only values without a type.
FREE_JSON = {"StartIn.input", "SignalIn.payload", "RunOut.input", "RunOut.result", "RunOut.error",
             "HistoryEntry.payload", "ScheduleIn.input", "ScheduleOut.input"}


def _untyped(schema: dict, components: dict, where: str) -> list[str]:
    """Where ``schema`` does not say what a value is (a type, a typed component, a union of those)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        target = components[name]
        return [w for prop, sub in target.get("properties", {}).items()
                for w in _untyped(sub, components, f"{name}.{prop}")]
    if "type" in schema and schema.get("type") != "array":  # typed (an allOf beside it only narrows it)
        return []
    for union in ("anyOf", "oneOf", "allOf"):
        if union in schema:
            return [w for sub in schema[union] for w in _untyped(sub, components, where)]
    if schema.get("type") == "array":
        return _untyped(schema.get("items", {}), components, f"{where}[]")
    return [] if {"type", "enum", "const"} & set(schema) else [where]


def test_it_documents_every_endpoint_with_typed_requests_and_answers():
    answer = login("sam", is_staff=True).get("/api/v1/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    components = doc["components"]["schemas"]
    found = {f"{method.upper()} {path}": op for path, ops in doc["paths"].items() for method, op in ops.items()}
    assert set(found) >= ENDPOINTS, sorted(ENDPOINTS - set(found))
    assert doc["components"]["securitySchemes"]["ApiKeyAuth"] == {"type": "http", "scheme": "bearer"}
    untyped: set[str] = set()
    for name, op in found.items():
        for param in op.get("parameters", []):
            untyped.update(_untyped(param["schema"], components, f"{name} ?{param['name']}"))
        if "requestBody" in op:
            untyped.update(_untyped(op["requestBody"]["content"]["application/json"]["schema"], components, name))
        ok = [code for code in op["responses"] if code.startswith("2")]
        assert ok, name
        for code in ok:
            untyped.update(_untyped(op["responses"][code]["content"]["application/json"]["schema"], components, name))
    # only the run's own JSON (input, result, payloads, evidence) is any JSON; everything else has a type
    for name, op in found.items():  # signed webhooks authenticate by signature; the problem pages hold
        # no data; everything else needs a key
        public = name.startswith(("POST /api/v1/hooks/", "GET /api/v1/problems/"))
        assert ("security" in op) == (not public), name
    assert untyped <= FREE_JSON, sorted(untyped - FREE_JSON)


def test_the_document_and_its_docs_page_are_readable_without_a_key_never_a_redirect():
    for path in ("/api/v1/docs", "/api/v1/openapi.json"):
        answer = Client().get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.get("Location"))
    assert Client().get("/api/v1/openapi.json").json()["info"]["title"] == "Saga Console API"


def test_every_operation_documents_its_errors_as_problem_json_and_the_headers_it_reads_and_sets():
    doc = Client().get("/api/v1/openapi.json").json()
    assert doc["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status", "detail"]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            errors = {code for code in op["responses"] if code.startswith(("4", "5"))}
            expected = {"500", "503"}
            if op.get("security"):
                expected |= {"401", "403", "429"}
            if "{" in path:
                expected.add("404")
            if op.get("requestBody"):
                expected |= {"400", "413", "415"}
            assert expected <= errors, (method, path, sorted(expected - errors))
            for code in errors:
                content = op["responses"][code]["content"]
                assert "application/problem+json" in content, (method, path, code)
            if "429" in errors:
                assert "Retry-After" in op["responses"]["429"]["headers"]
    expecting = [name for name, body in doc["components"]["schemas"].items() if "expected" in body.get("properties", {})]
    assert len(expecting) >= 8
    for name in expecting:  # the server refuses an action without it: the document says so
        body = doc["components"]["schemas"][name]
        assert "expected" in body["required"] and "default" not in body["properties"]["expected"], name
    start = doc["paths"]["/api/v1/runs"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in start["parameters"])


def test_it_serves_the_docs_page_from_our_static_files_under_the_strict_csp():
    page = login("sam", is_staff=True).get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    csp = page["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe" not in csp
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/static/ninja/") for a in assets), assets
    assert all(finders.find(a.removeprefix("/static/")) for a in assets), assets
    # the only inline <script> is data (the settings, JSON), which the CSP does not run; none executes inline
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html)
    assert inline == [' type="application/json" id="swagger-settings"'], inline
    assert "style=" not in html and "<style" not in html


def test_openapi_spec_validator_accepts_the_document():
    """What a client generator's own check says (openapi-spec-validator, OpenAPI 3.1)."""
    from openapi_spec_validator import validate

    doc = Client().get("/api/v1/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises with the path of the first error

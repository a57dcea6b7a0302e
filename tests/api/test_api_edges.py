"""Every answer under /api/v1/ is problem JSON, including those no operation gives (an unknown
path, a wrong method, a body that is not JSON), and each problem type leads to its own page."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from api.errors import PROBLEMS
from sagas.models import WorkflowRun

pytestmark = pytest.mark.django_db


def problem(answer) -> dict:
    assert answer["Content-Type"] == "application/problem+json", (answer.status_code, answer["Content-Type"])
    return json.loads(answer.content)


@pytest.mark.parametrize("debug", [False, True])
def test_an_unknown_path_is_a_404_problem_not_an_html_page(settings, debug):
    settings.DEBUG = debug
    for path in ("/api/v1/nothing-here", "/api/v1/runs/not/a/path/", "/api/v1/<script>"):
        answer = Client().get(path)
        assert answer.status_code == 404
        body = problem(answer)
        assert body["type"] == "/api/v1/problems/not-found" and "no such path" in body["detail"]
        assert answer["X-Content-Type-Options"] == "nosniff"  # the echoed path is JSON, never sniffed as HTML


def test_a_method_a_path_does_not_take_is_a_405_problem_with_allow(keys):
    answer = Client().delete("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {keys['operator']}")
    assert answer.status_code == 405
    body = problem(answer)
    assert body["type"] == "/api/v1/problems/method-not-allowed"
    assert "GET" in answer["Allow"] and "POST" in answer["Allow"]


def test_a_body_that_is_not_json_is_refused_with_415_and_starts_nothing(keys):
    before = WorkflowRun.objects.count()
    answer = Client().post("/api/v1/runs", data=json.dumps({"workflow": "order", "input": {}}),
                           content_type="text/plain", HTTP_AUTHORIZATION=f"Bearer {keys['operator']}")
    assert answer.status_code == 415
    assert problem(answer)["type"] == "/api/v1/problems/unsupported-media-type"
    assert WorkflowRun.objects.count() == before


def test_each_problem_type_uri_leads_to_a_page_that_documents_it():
    listed = Client().get("/api/v1/problems/").json()
    assert {p["type"] for p in listed} == {f"/api/v1/problems/{kind}" for kind in PROBLEMS}
    for kind, (status, title) in PROBLEMS.items():
        page = Client().get(f"/api/v1/problems/{kind}")
        assert page.status_code == 200, kind
        assert page.json()["status"] == status and page.json()["title"] == title
        assert len(page.json()["description"]) > 20
    unknown = Client().get("/api/v1/problems/no-such-kind")
    assert unknown.status_code == 404 and problem(unknown)["type"] == "/api/v1/problems/not-found"


@pytest.mark.parametrize("value", ["0.5", "1796674464", "-3", "1e9"])
def test_a_date_time_parameter_takes_iso_8601_only_as_the_schema_says(keys, value):
    answer = Client().get("/api/v1/runs", {"created_to": value}, HTTP_AUTHORIZATION=f"Bearer {keys['viewer']}")
    assert answer.status_code == 400
    body = problem(answer)
    assert body["type"] == "/api/v1/problems/validation"
    assert any("ISO 8601" in e["msg"] and "created_to" in e["loc"] for e in body["errors"]), body
    fine = Client().get("/api/v1/runs", {"created_to": "2026-12-07T09:30:00Z"},
                        HTTP_AUTHORIZATION=f"Bearer {keys['viewer']}")
    assert fine.status_code == 200


def test_the_schema_carries_the_servers_constraints_and_the_server_refuses_what_it_refuses(keys):
    doc = Client().get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert doc["StartIn"]["properties"]["business_key"]["pattern"] == "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    budget_cost = doc["Budget"]["properties"]["max_cost"]
    assert any(branch.get("maximum") == 99999999.999999 for branch in budget_cost.get("anyOf", [budget_cost]))
    operator = {"HTTP_AUTHORIZATION": f"Bearer {keys['operator']}"}
    before = WorkflowRun.objects.count()
    for body, field in (({"workflow": "order", "business_key": "tab\there"}, "business_key"),
                        ({"workflow": "order\x00"}, "workflow"),
                        ({"workflow": "order\x9b"}, "workflow"),  # a C1 control character, as the engine refuses
                        ({"workflow": "order", "budget": {"max_cost": 1e9}}, "max_cost")):
        answer = Client().post("/api/v1/runs", data=json.dumps(body), content_type="application/json", **operator)
        assert answer.status_code == 400, (body, answer.status_code)
        assert any(field in e["loc"] for e in problem(answer)["errors"]), problem(answer)
    assert WorkflowRun.objects.count() == before
    bad_cursor = Client().get("/api/v1/runs", {"cursor": "not-a-cursor"}, **operator)
    assert bad_cursor.status_code == 400 and any("cursor" in e["loc"] for e in problem(bad_cursor)["errors"])


def test_the_schema_says_what_each_filter_and_body_takes_exactly(keys):
    """What schemathesis found the schema allowed and the server refused (each is now refused by
    the schema's own rule, with the field named, or accepted)."""
    doc = Client().get("/api/v1/openapi.json").json()
    viewer = {"HTTP_AUTHORIZATION": f"Bearer {keys['viewer']}"}
    operator = {"HTTP_AUTHORIZATION": f"Bearer {keys['operator']}"}
    for path, params, field in (("/api/v1/approvals", {"state": "pending"}, "state"),
                                ("/api/v1/effects", {"status": "SUCCEEDED"}, "status"),
                                ("/api/v1/effects", {"cursor": "472_c9"}, "cursor"),
                                ("/api/v1/runs", {"parent": "0" * 99}, "parent"),
                                ("/api/v1/runs", {"status": "DONE"}, "status")):
        answer = Client().get(path, params, **viewer)
        assert answer.status_code == 400 and any(field in e["loc"] for e in problem(answer)["errors"]), (path, params)
    both = Client().get("/api/v1/runs", {"top_level": "true", "parent": "6f1c2a3b-0000-4000-8000-000000000000"},
                        **viewer)
    assert both.status_code == 200 and both.json()["items"] == []  # children are never top-level: none
    schedule = doc["components"]["schemas"]["ScheduleIn"]
    assert len(schedule["oneOf"]) == 2 and "Europe/Berlin" in schedule["properties"]["timezone"]["enum"]
    limits = doc["components"]["schemas"]["LimitsIn"]
    assert limits["properties"]["burst"] == {"maximum": 1000000, "minimum": 1, "title": "Burst", "type": "integer"}
    put = Client().put("/api/v1/connectors/model/limits", data=json.dumps(
        {"declared": False, "rate": 1, "burst": 2.0, "max_in_flight": None, "key_field": "", "circuit_failures": 0,
         "circuit_window_seconds": 1, "circuit_cooldown_seconds": None, "reason": "r", "expected": "active"}),
        content_type="application/json", **operator)
    assert put.status_code == 400 and any("circuit_cooldown_seconds" in e["loc"] for e in problem(put)["errors"])
    spend = Client().put("/api/v1/spend-limits/acme/model%1d", data=json.dumps(
        {"per_day": 0.000003, "reason": "r", "expected": "none"}), content_type="application/json", **operator)
    assert spend.status_code == 400 and any("connector" in e["loc"] for e in problem(spend)["errors"])
    replay = Client().post("/api/v1/workflows/replay-check", data=json.dumps({"workflow": "nope"}),
                           content_type="application/json", **viewer)
    assert replay.status_code == 404 and problem(replay)["type"].endswith("/not-found")


@pytest.mark.django_db(transaction=True)  # the 500 this was left the request's transaction aborted
def test_a_date_time_with_an_offset_postgresql_refuses_is_taken_in_utc(keys):
    """Found by schemathesis: ISO 8601 allows an offset of -18:18, PostgreSQL refuses one past
    ±15:59 (a 500); and a time in range only with its offset overflowed. Both are filters now."""
    viewer = {"HTTP_AUTHORIZATION": f"Bearer {keys['viewer']}"}
    for params in ({"created_from": "6336-09-15T08:59:54-18:18"}, {"created_to": "0001-01-01T00:00:00+01:00"},
                   {"created_from": "9999-12-31T23:59:59-01:00"}):
        answer = Client().get("/api/v1/runs", params, **viewer)
        assert answer.status_code == 200 and answer.json()["items"] == [], (params, answer.content)

"""Issue 35 in the HTTP API: a run says which run started it (``parent_run_id``) and whether it
was started ``detached``; the runs list takes ``top_level=true`` and ``parent=<run id>``."""

from __future__ import annotations

import uuid

import pytest

from sagas.models import RunStatus
from tests.api.actions_data import call, problem, walk
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db


def test_a_run_says_its_parent_and_whether_it_is_detached(keys):
    parent = make_run(status=RunStatus.WAITING, reason="")
    kid = make_run(status=RunStatus.RUNNING, reason="", parent_run=parent.id, started_via="parent")
    free = make_run(status=RunStatus.RUNNING, reason="", parent_run=parent.id, detached=True, started_via="parent")
    answer = call("get", f"/runs/{kid.id}", keys["viewer"])
    assert answer.status_code == 200
    assert (answer.json()["parent_run_id"], answer.json()["detached"]) == (str(parent.id), False)
    assert call("get", f"/runs/{free.id}", keys["viewer"]).json()["detached"] is True
    top = call("get", f"/runs/{parent.id}", keys["viewer"]).json()
    assert (top["parent_run_id"], top["detached"]) == (None, False)
    items = {r["id"]: r for r in walk("/runs", keys["viewer"])}
    assert items[str(kid.id)]["parent_run_id"] == str(parent.id) and items[str(parent.id)]["parent_run_id"] is None
    assert items[str(free.id)]["detached"] is True


def test_the_list_filters_top_level_runs_and_one_runs_children(keys):
    parent = make_run(status=RunStatus.WAITING, reason="")
    other = make_run(status=RunStatus.WAITING, reason="")
    kids = [make_run(status=status, reason="", parent_run=parent.id) for status in
            (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPLETED)]
    make_run(status=RunStatus.COMPLETED, reason="", parent_run=other.id)

    assert {r["id"] for r in walk("/runs?top_level=true&limit=1", keys["viewer"])} == {str(parent.id), str(other.id)}
    assert [r["id"] for r in walk(f"/runs?parent={parent.id}&limit=2", keys["viewer"])] == [
        str(k.id) for k in reversed(kids)]
    assert [r["id"] for r in walk(f"/runs?parent={parent.id.hex}&status=FAILED", keys["viewer"])] == [str(kids[1].id)]
    assert walk(f"/runs?parent={uuid.uuid4()}", keys["viewer"]) == []
    # A parent's children are never top-level: both filters together list nothing (as the schema
    # allows them together; schemathesis found the 400 this was).
    assert walk(f"/runs?parent={parent.id}&top_level=true", keys["viewer"]) == []
    for query in ("parent=not-a-run", "parent=1234", "top_level=maybe"):
        answer = call("get", f"/runs?{query}", keys["viewer"])
        assert answer.status_code in (400, 422), (query, answer.status_code)
        assert problem(answer) == "validation", query


def test_the_openapi_document_describes_the_tree_fields_and_filters(keys):
    from tests.api.conftest import login

    doc = login("sam", is_staff=True).get("/api/v1/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for name in ("RunOut", "RunSummary"):
        assert {"parent_run_id", "detached"} <= set(schemas[name]["properties"]), name
    params = {p["name"] for p in doc["paths"]["/api/v1/runs"]["get"]["parameters"]}
    assert {"top_level", "parent"} <= params

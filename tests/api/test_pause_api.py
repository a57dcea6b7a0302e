"""Pause and resume over the HTTP API: a run's (``/runs/{id}/pause``, ``/resume``) and a
workflow's (``/workflows/pause``, ``/resume``, ``/pauses``): roles, tenants, the state the
caller saw, and what the run then says (``paused``)."""

from __future__ import annotations

import pytest

from operators.models import AuditEntry
from sagas.models import WorkflowPause, WorkflowRun
from tests.api.actions_data import call, problem, waiting_run

pytestmark = pytest.mark.django_db


def test_a_key_pauses_and_resumes_a_run_with_the_state_it_saw(keys):
    run = waiting_run()
    path = f"/runs/{run.id}/pause"
    assert problem(call("post", path, keys["operator"], {"reason": "look"})) == "validation"  # no expected
    assert problem(call("post", path, keys["viewer"], {"reason": "look", "expected": "WAITING"})) == "forbidden"
    done = call("post", path, keys["operator"], {"reason": "look", "expected": "WAITING"})
    assert done.status_code == 200 and done.json()["run"]["paused"] is True
    assert call("get", f"/runs/{run.id}", keys["viewer"]).json()["paused"] is True
    again = call("post", path, keys["operator2"], {"reason": "look", "expected": "WAITING"})
    assert again.status_code == 409 and "already paused" in again.json()["detail"]

    resumed = call("post", f"/runs/{run.id}/resume", keys["operator"], {"reason": "fine", "expected": "WAITING"})
    assert resumed.status_code == 200 and resumed.json()["run"]["paused"] is False
    assert problem(call("post", f"/runs/{run.id}/resume", keys["operator"],
                        {"reason": "fine", "expected": "WAITING"})) == "conflict"  # not paused any more
    outcomes = list(AuditEntry.objects.filter(action__in=["run.pause", "run.resume"]).order_by("id")
                    .values_list("action", "outcome"))
    assert outcomes == [("run.pause", "refused"), ("run.pause", "denied"), ("run.pause", "ok"),
                        ("run.pause", "refused"), ("run.resume", "ok"), ("run.resume", "refused")]


def test_a_workflow_pause_needs_a_key_that_sees_every_tenant_and_holds_every_run(keys):
    run = waiting_run()
    body = {"workflow": "api_gate", "reason": "provider incident", "expected": "running"}
    assert problem(call("post", "/workflows/pause", keys["acme-operator"], body)) == "forbidden"
    assert problem(call("post", "/workflows/pause", keys["viewer"], body)) == "forbidden"
    assert problem(call("post", "/workflows/pause", keys["operator"], {**body, "workflow": "no_such_flow"})) \
        == "validation"
    done = call("post", "/workflows/pause", keys["operator"], body)
    assert done.status_code == 200
    [pause] = done.json()["pauses"]
    assert (pause["workflow"], pause["version"], pause["paused_by"]) == ("api_gate", None, "api:operator")
    assert call("get", f"/runs/{run.id}", keys["viewer"]).json()["paused"] is True
    assert call("get", "/workflows/pauses?workflow=api_gate", keys["viewer"]).json()[0]["reason"] \
        == "provider incident"
    stale = call("post", "/workflows/pause", keys["operator2"], body)
    assert stale.status_code == 409 and problem(stale) == "stale-state"

    lifted = call("post", "/workflows/resume", keys["operator"],
                  {"workflow": "api_gate", "reason": "incident over", "expected": "paused"})
    assert lifted.status_code == 200 and lifted.json()["pauses"] == []
    assert not WorkflowPause.objects.exists()
    assert call("get", f"/runs/{run.id}", keys["viewer"]).json()["paused"] is False
    assert WorkflowRun.objects.get(id=run.id).status == "WAITING"


def test_a_key_moves_a_run_checks_a_workflow_and_is_refused_a_divergent_move(keys):
    from sagas import start
    from sagas.testing import run_until_idle
    from tests.sagas import wf_repair  # noqa: F401  (rm_order versions 1 to 3 in this process)

    run = start("rm_order", {"id": "api-m"}, version=1)
    run_until_idle(run.id)
    checked = call("post", "/workflows/replay-check", keys["viewer"], {"workflow": "rm_order", "version": 3})
    assert checked.status_code == 200 and checked.json()["counts"]["diverges"] == 1
    assert call("post", "/workflows/replay-check", keys["acme-operator"],
                {"workflow": "rm_order", "version": 3}).json()["runs"] == []  # not its tenant's run
    assert problem(call("post", "/workflows/replay-check", keys["viewer"],
                        {"workflow": "rm_order", "version": 9})) == "not-found"  # well formed, not here

    diverging = call("post", f"/runs/{run.id}/move", keys["operator"],
                     {"version": 3, "reason": "try", "expected": "WAITING"})
    assert diverging.status_code == 409 and "reserve_stock" in diverging.json()["detail"]
    moved = call("post", f"/runs/{run.id}/move", keys["operator"], {"version": 2, "reason": "fix", "expected": "WAITING"})
    assert moved.status_code == 200 and moved.json()["run"]["version"] == 2
    assert problem(call("post", f"/runs/{run.id}/redrive", keys["operator"],
                        {"reason": "x", "expected": "WAITING"})) == "conflict"  # not failed: nothing to redrive

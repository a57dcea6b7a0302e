"""Schedules over the HTTP API (``/schedules``): create one, read its next fire times, pause and
resume it with the state seen, trigger it, preview and run a backfill, delete it; roles, tenants,
bad input, and the audit entry of every change."""

from __future__ import annotations

from datetime import datetime

import pytest

from operators.models import AuditEntry
from sagas.models import Schedule, ScheduleTick, WorkflowRun
from tests.api.actions_data import call, problem

pytestmark = pytest.mark.django_db

NIGHTLY = {"name": "nightly-gate", "workflow": "api_gate", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
           "input": {"id": "sched"}, "business_key": "gate-{fire_time:%Y-%m-%d}", "overlap": "allow_all",
           "reason": "nightly run"}


def test_a_key_creates_a_schedule_and_reads_its_next_fire_times(keys):
    assert problem(call("post", "/schedules", keys["viewer"], NIGHTLY)) == "forbidden"
    made = call("post", "/schedules", keys["operator"], NIGHTLY)
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["name"], body["cron"], body["timezone"], body["state"], body["source"]) == (
        "nightly-gate", "0 2 * * *", "Europe/Berlin", "active", "api")
    times = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in body["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times)
    assert all(t.hour in (0, 1) and t.minute == 0 for t in times)  # 02:00 in Berlin is 00:00 or 01:00 UTC
    assert call("get", "/schedules/nightly-gate", keys["viewer"]).json()["input"] == {"id": "sched"}
    assert [s["name"] for s in call("get", "/schedules", keys["viewer"]).json()] == ["nightly-gate"]
    again = call("post", "/schedules", keys["operator"], NIGHTLY)
    assert again.status_code == 409 and "already a schedule" in again.json()["detail"]
    entry = AuditEntry.objects.get(action="schedule.create", outcome="ok")
    assert (entry.object_id, entry.reason, entry.actor_label) == ("nightly-gate", "nightly run", "system: api key operator")


@pytest.mark.parametrize(("change", "problem_type", "says"), [
    ({"cron": "0 25 * * *"}, "validation", "Bad hour"),
    ({"timezone": "Europe/Atlantis"}, "validation", "unknown time zone"),
    ({"business_key": "gate-{fire_time:%Y}"}, "validation", "the same key"),
    ({"cron": None}, "validation", "exactly one of cron and every"),
    ({"every_seconds": 60}, "validation", "exactly one of cron and every"),
    ({"name": "has space"}, "validation", "name: String should match pattern"),
    ({"workflow": "no_such_flow"}, "unknown-workflow", "no_such_flow"),
    ({"overlap": "queue"}, "validation", "overlap: String should match pattern"),
    ({"input": {"text": "a\u0000b"}}, "validation", "NUL"),
])
def test_it_refuses_a_malformed_schedule_and_creates_nothing(keys, change, problem_type, says):
    answer = call("post", "/schedules", keys["operator"], {**NIGHTLY, **change})
    assert problem(answer) == problem_type, answer.json()
    assert says in answer.json()["detail"]
    assert not Schedule.objects.exists()


def test_a_key_pauses_triggers_backfills_and_deletes_a_schedule_with_the_state_it_saw(keys):
    assert call("post", "/schedules", keys["operator"], NIGHTLY).status_code == 201
    path = "/schedules/nightly-gate"
    assert problem(call("post", f"{path}/pause", keys["operator"], {"reason": "freeze"})) == "validation"
    paused = call("post", f"{path}/pause", keys["operator"], {"reason": "freeze", "expected": "active"})
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert paused.json()["next_fire_times"] == []
    stale = call("post", f"{path}/pause", keys["operator2"], {"reason": "freeze", "expected": "active"})
    assert problem(stale) == "stale-state"
    resumed = call("post", f"{path}/resume", keys["operator"], {"reason": "go", "expected": "paused"})
    assert resumed.json()["state"] == "active"

    tick = call("post", f"{path}/trigger", keys["operator"], {"reason": "rerun"})
    assert tick.status_code == 200 and tick.json()["outcome"] == "started" and tick.json()["how"] == "trigger"
    run = WorkflowRun.objects.get(id=tick.json()["run_id"])
    assert run.workflow_name == "api_gate" and run.started_via == "schedule"

    window = "start=2026-01-10T00:00:00Z&end=2026-01-12T23:00:00Z"
    preview = call("get", f"{path}/backfill?{window}", keys["viewer"]).json()
    assert [p["business_key"] for p in preview] == ["gate-2026-01-10", "gate-2026-01-11", "gate-2026-01-12"]
    assert all(p["handled"] is None for p in preview)
    body = {"start": "2026-01-10T00:00:00Z", "end": "2026-01-12T23:00:00Z", "reason": "missed nights"}
    assert problem(call("post", f"{path}/backfill", keys["viewer"], body)) == "forbidden"
    fired = call("post", f"{path}/backfill", keys["operator"], body).json()
    assert [t["outcome"] for t in fired] == ["started"] * 3
    assert call("post", f"{path}/backfill", keys["operator"], body).json() == []  # nothing left to fire
    too_long = call("post", f"{path}/backfill", keys["operator"], {**body, "start": "2020-01-01T00:00:00Z"})
    assert problem(too_long) == "validation" and "at most 1000" in too_long.json()["detail"]
    assert ScheduleTick.objects.filter(how="backfill").count() == 3

    gone = call("post", f"{path}/delete", keys["operator"], {"reason": "done", "expected": "active"})
    assert gone.status_code == 200
    assert problem(call("get", path, keys["viewer"])) == "not-found"
    assert WorkflowRun.objects.filter(workflow_name="api_gate").count() == 4  # the runs stay
    actions = list(AuditEntry.objects.filter(action__startswith="schedule.").order_by("id")
                   .values_list("action", "outcome"))
    assert actions == [
        ("schedule.create", "ok"), ("schedule.pause", "refused"), ("schedule.pause", "ok"),
        ("schedule.pause", "refused"), ("schedule.resume", "ok"), ("schedule.trigger", "ok"),
        ("schedule.backfill", "denied"), ("schedule.backfill", "ok"), ("schedule.backfill", "ok"),
        ("schedule.backfill", "refused"), ("schedule.delete", "ok")]


def test_a_key_limited_to_one_tenant_sees_and_steers_only_its_schedules(keys):
    assert call("post", "/schedules", keys["operator"], {**NIGHTLY, "tenant": "other"}).status_code == 201
    refused = call("post", "/schedules", keys["acme-operator"], {**NIGHTLY, "name": "theirs", "tenant": "other"})
    assert problem(refused) == "forbidden"
    assert call("get", "/schedules", keys["acme-operator"]).json() == []
    assert problem(call("get", "/schedules/nightly-gate", keys["acme-operator"])) == "not-found"
    attempt = call("post", "/schedules/nightly-gate/trigger", keys["acme-operator"], {"reason": "x"})
    assert problem(attempt) == "not-found"
    assert not ScheduleTick.objects.exists()
    assert problem(call("get", "/schedules/no%00such", keys["viewer"])) == "not-found"

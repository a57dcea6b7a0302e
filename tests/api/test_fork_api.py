"""Re-run from a step over the HTTP API (``GET``/``POST /runs/{id}/fork``): the preview, effect by
effect, in both modes (reuse the later effects' outcomes, or compensate them first); making the
new run; roles, the re-runs the caller saw, and an unknown outcome blocking it."""

from __future__ import annotations

import pytest

from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas.models import JournalEntry, WorkflowRun
from tests.api.actions_data import call, problem
from tests.console.run_data import waiting_run

pytestmark = pytest.mark.django_db


def test_a_key_previews_both_modes_and_re_runs_a_run_compensating_first(keys):
    run = waiting_run("o-api-fork")  # charge (compensable), ship (irreversible), then an approval
    charge = JournalEntry.objects.get(run=run, kind="effect_intent", name="charge").seq
    path = f"/runs/{run.id}/fork"

    reuse = call("get", f"{path}?at_seq={charge}", keys["viewer"]).json()
    assert {e["name"]: e["fate"] for e in reuse["effects"]} == {"charge": "reused", "ship": "reused"}
    undo = call("get", f"{path}?at_seq={charge}&compensate_first=true", keys["viewer"]).json()
    assert undo["compensate_first"] is True and undo["blockers"] == []
    assert {e["name"]: (e["fate"], e["irreversible"]) for e in undo["effects"]} == {
        "charge": ("undone", False), "ship": ("reused", True)}

    body = {"at_seq": charge, "compensate_first": True, "reason": "wrong amount", "expected": "WAITING",
            "forks_seen": 0}
    assert problem(call("post", path, keys["viewer"], body)) == "forbidden"
    made = call("post", path, keys["operator"], body)
    assert made.status_code == 201, made.content
    fork = WorkflowRun.objects.get(id=made.json()["run"]["id"])
    assert fork.forked_from == run.id
    assert [u["name"] for u in JournalEntry.objects.get(run=fork, kind="forked").payload["undo"]] == ["charge"]
    twice = call("post", path, keys["operator2"], body)  # the same re-run asked for again
    assert twice.status_code == 409 and WorkflowRun.objects.filter(forked_from=run.id).count() == 1
    assert list(AuditEntry.objects.filter(action="run.fork").order_by("id").values_list("outcome", flat=True)) \
        == ["denied", "ok", "refused"]


def test_an_unknown_outcome_blocks_a_re_run_over_the_api(keys):
    run = waiting_run("o-api-fork-2")
    EffectRecord.objects.filter(run_id=run.id, step_name="ship").update(status=EffectStatus.UNKNOWN)
    charge = JournalEntry.objects.get(run=run, kind="effect_intent", name="charge").seq
    preview = call("get", f"/runs/{run.id}/fork?at_seq={charge}", keys["viewer"]).json()
    assert any("resolve it first" in b for b in preview["blockers"])
    refused = call("post", f"/runs/{run.id}/fork", keys["operator"],
                   {"at_seq": charge, "reason": "again", "expected": "WAITING"})
    assert refused.status_code == 409 and "resolve it first" in refused.json()["detail"]
    assert not WorkflowRun.objects.filter(forked_from=run.id).exists()

"""The approvals and ambiguous-effects queues over the API: paged lists of the key's tenants,
decisions with four-eyes, reasons and the state the caller saw; and, over real HTTP with a real
worker, a run started twenty times at once that an approver lets finish."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas.models import ApprovalRequest, ApprovalState, RunStatus, WorkflowRun
from tests.api.actions_data import approval_of, call, problem, waiting_run, walk
from tests.console.queue_data import make_approval, make_effect, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_lists_open_approvals_of_the_keys_tenants_in_pages(keys):
    mine = [make_approval(deadline_in=timedelta(hours=1 + i % 3)) for i in range(7)]
    acme = make_approval(run=make_run(status=RunStatus.WAITING, reason="", tenant="acme"))
    make_approval(state=ApprovalState.APPROVED)

    pending = walk("/approvals?state=PENDING&limit=2", keys["approver"])
    assert sorted(a["id"] for a in pending) == sorted(a.id for a in [*mine, acme])  # once each, decided left out
    assert [a["deadline"] for a in pending] == sorted(a["deadline"] for a in pending)
    assert [a["id"] for a in walk("/approvals", keys["acme-operator"])] == [acme.id]
    assert len(walk("/approvals?state=APPROVED", keys["viewer"])) == 1
    assert problem(call("get", "/approvals?state=MAYBE", keys["viewer"])) == "validation"
    assert problem(call("get", "/approvals?cursor=1_2_3", keys["viewer"])) == "validation"


def test_it_decides_an_approval_with_four_eyes_a_reason_to_reject_and_the_state_seen(keys):
    own = approval_of(waiting_run(key="approver", order="o-own"))
    selfish = call("post", f"/approvals/{own.id}/decide", keys["approver"],
                   {"approve": True, "comment": "mine", "expected": "PENDING"})
    assert selfish.status_code == 409 and problem(selfish) == "four-eyes"
    assert "started this run" in selfish.json()["detail"]
    assert ApprovalRequest.objects.get(id=own.id).state == ApprovalState.PENDING

    approval = approval_of(waiting_run(order="o-2"))
    path = f"/approvals/{approval.id}/decide"
    bare = call("post", path, keys["approver"], {"approve": False, "comment": "  ", "expected": "PENDING"})
    assert bare.status_code == 400 and problem(bare) == "validation" and "reason" in bare.json()["detail"]
    unsaid = call("post", path, keys["approver"], {"approve": True, "comment": "ok"})
    assert problem(unsaid) == "validation" and "expected" in unsaid.json()["detail"]

    done = call("post", path, keys["approver"],
                {"approve": True, "comment": "<i>ok</i> to ship", "expected": "PENDING"})
    assert done.status_code == 200, done.content
    assert done.json()["approval"]["state"] == "APPROVED" and done.json()["approval"]["decided_by"] == "api:approver"
    assert done.json()["run"]["status"] == "PENDING"  # woken: a worker takes it on
    late = call("post", path, keys["approver"], {"approve": False, "comment": "no", "expected": "PENDING"})
    assert late.status_code == 409 and problem(late) == "stale-state"
    assert "already approved by api:approver" in late.json()["detail"]
    assert AuditEntry.objects.filter(object_type="approval", outcome="refused").count() == 4
    assert problem(call("post", f"/approvals/{10**30}/decide", keys["approver"],
                        {"approve": True, "expected": "PENDING"})) == "not-found"
    assert problem(call("post", "/approvals/999999/decide", keys["approver"],
                        {"approve": True, "expected": "PENDING"})) == "not-found"


def test_it_lists_unknown_effects_and_resolves_one_with_evidence(keys):
    effects = [make_effect(age=timedelta(minutes=10 + i)) for i in range(5)]
    acme = make_effect(run=make_run(tenant="acme"), tenant="acme")
    make_effect(status=EffectStatus.SUCCEEDED)

    listed = walk("/effects?status=UNKNOWN&limit=2", keys["viewer"])
    assert sorted(e["id"] for e in listed) == sorted(e.id for e in [*effects, acme])
    assert [e["id"] for e in walk("/effects", keys["acme-operator"])] == [acme.id]
    assert problem(call("get", "/effects?status=SUCCEEDED", keys["viewer"])) == "validation"

    effect = effects[0]
    path = f"/effects/{effect.id}/resolve"
    evidence = {"outcome": "succeeded", "downstream_ref": "ch_123", "note": "dashboard shows ch_123 captured"}
    no_ref = call("post", path, keys["operator"], {**evidence, "downstream_ref": "", "expected": "UNKNOWN"})
    assert no_ref.status_code == 400 and problem(no_ref) == "validation"
    no_note = call("post", path, keys["operator"], {**evidence, "note": " ", "expected": "UNKNOWN"})
    assert no_note.status_code == 400 and problem(no_note) == "validation"
    assert problem(call("post", path, keys["operator"], {**evidence, "outcome": "maybe", "expected": "UNKNOWN"})) \
        == "validation"
    stale = call("post", path, keys["operator"], {**evidence, "expected": "IN_PROGRESS"})
    assert stale.status_code == 409 and problem(stale) == "stale-state" and "now UNKNOWN" in stale.json()["detail"]
    assert EffectRecord.objects.get(id=effect.id).status == EffectStatus.UNKNOWN

    done = call("post", path, keys["operator"], {**evidence, "expected": "UNKNOWN"})
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "SUCCEEDED" and done.json()["downstream_ref"] == "ch_123"
    again = call("post", path, keys["operator2"], {**evidence, "expected": "UNKNOWN"})
    assert problem(again) == "stale-state" and "already resolved by api:operator" in again.json()["detail"]
    # a tenant-limited key cannot resolve another tenant's effect: for it, the effect does not exist
    assert problem(call("post", path, keys["acme-operator"], {**evidence, "expected": "SUCCEEDED"})) == "not-found"


def _wait(api_server, key: str, run_id: str, status: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = api_server.call("GET", f"/runs/{run_id}", key).body
        if run["status"] == status or time.monotonic() > deadline:
            assert run["status"] == status, run
            return run
        time.sleep(0.2)


def test_twenty_identical_starts_make_one_run_that_an_approver_lets_finish_over_http(api_server, keys):
    body = {"workflow": "approve_then_ship", "input": {"id": "o-api-1"}}
    headers = {"Idempotency-Key": "order-o-api-1"}
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: api_server.call("POST", "/runs", keys["operator"], body, headers=headers),
                                range(20)))
    assert sorted(a.status for a in answers) == [200] * 19 + [201], [(a.status, a.body) for a in answers]
    assert len({a.body["id"] for a in answers}) == 1 and WorkflowRun.objects.count() == 1
    run_id = answers[0].body["id"]

    api_server.worker("w1")
    _wait(api_server, keys["viewer"], run_id, "WAITING")
    inbox = api_server.call("GET", "/approvals?state=PENDING", keys["approver"]).body["items"]
    assert [(a["run_id"], a["step"], a["started_by"]) for a in inbox] == [(run_id, "ship", "api:operator")]
    decided = api_server.call("POST", f"/approvals/{inbox[0]['id']}/decide", keys["approver"],
                              {"approve": True, "comment": "address checked", "expected": "PENDING"})
    assert decided.status == 200, decided.body
    done = _wait(api_server, keys["viewer"], run_id, "COMPLETED")
    assert done["result"]["approved_by"] == "api:approver" and done["result"]["shipment"]
    history = api_server.call("GET", f"/runs/{run_id}/history", keys["viewer"]).body["entries"]
    assert history[0]["kind"] == "completed" and any(e["kind"] == "approval_decided" for e in history)
    assert AuditEntry.objects.filter(action="run.start", object_id=run_id).count() == 1

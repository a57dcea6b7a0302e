"""The runs endpoints beyond start: the list (filters, pages, tenants), the history (pages,
redaction), signal, cancel with the state the caller saw, and hostile input."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from core.redaction import MARK
from ledger.models import EffectRecord
from operators.models import AuditEntry
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.api.actions_data import SECRET, approval_of, call, problem, waiting_run, walk
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db


def aged(run: WorkflowRun, created_at) -> WorkflowRun:
    WorkflowRun.objects.filter(id=run.id).update(created_at=created_at)
    return run


def test_it_lists_runs_with_the_consoles_filters_in_pages_without_duplicates(keys):
    now = timezone.now()
    same_time = now - timedelta(hours=1)  # ties on created_at: the id breaks them
    made = [aged(make_run(status=RunStatus.WAITING, reason="", business_key=f"order-{i}"), same_time)
            for i in range(5)]
    made += [aged(make_run(status=RunStatus.COMPLETED, reason="", business_key=f"order-{i}"), now - timedelta(
        minutes=i)) for i in range(5, 9)]
    made.append(make_run(status=RunStatus.WAITING, reason="", business_key="acme-1", tenant="acme"))

    everything = walk("/runs?limit=3", keys["viewer"])
    assert sorted(r["id"] for r in everything) == sorted(str(r.id) for r in made)  # all, once each
    assert [r["created_at"] for r in everything] == sorted((r["created_at"] for r in everything), reverse=True)

    waiting = walk("/runs?status=WAITING&limit=2", keys["viewer"])
    assert len(waiting) == 6 and {r["status"] for r in waiting} == {"WAITING"}
    assert [r["business_key"] for r in walk("/runs?search=ORDER-7", keys["viewer"])] == ["order-7"]
    assert sorted(r["business_key"] for r in walk("/runs?search=ACME*", keys["viewer"])) == ["acme-1"]
    assert walk("/runs?search=rder*", keys["viewer"]) == []  # inside "order-…", not at its start
    window = walk(f"/runs?created_to={(now - timedelta(minutes=30)).isoformat().replace('+', '%2B')}", keys["viewer"])
    assert len(window) == 5
    naive = (now - timedelta(minutes=30)).replace(tzinfo=None).isoformat()  # read as UTC
    assert len(walk(f"/runs?created_to={naive}", keys["viewer"])) == 5
    # a tenant-limited key sees its tenant only, whatever it asks for
    assert [r["business_key"] for r in walk("/runs", keys["acme-operator"])] == ["acme-1"]
    assert walk("/runs?tenant=default", keys["acme-operator"]) == []

    assert problem(call("get", "/runs?status=SLEEPING", keys["viewer"])) == "validation"
    assert problem(call("get", "/runs?cursor=not-a-cursor", keys["viewer"])) == "validation"
    assert problem(call("get", f"/runs?limit={10**30}", keys["viewer"])) == "validation"
    assert problem(call("get", "/runs?search=%00", keys["viewer"])) == "validation"
    assert problem(call("get", "/runs?search=**", keys["viewer"])) == "validation"  # starts with nothing


def test_it_pages_a_runs_history_newest_first_with_its_secrets_redacted(keys):
    run = waiting_run()
    entries = walk(f"/runs/{run.id}/history?limit=1", keys["viewer"])
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) == JournalEntry.objects.filter(run=run).count() >= 3
    login = next(e for e in entries if e["name"] == "login")
    assert SECRET in str(JournalEntry.objects.get(run=run, seq=login["seq"]).payload)  # stored...
    assert SECRET not in str(entries)  # ...never shown
    assert "<b>markup</b>" in str(login["payload"])  # data, returned as JSON, not rendered
    # another tenant's run does not exist for a tenant-limited key
    assert problem(call("get", f"/runs/{run.id}/history", keys["acme-operator"])) == "not-found"
    assert problem(call("get", "/runs/not-a-uuid/history", keys["viewer"])) == "not-found"
    assert problem(call("get", f"/runs/{run.id}/history?before={10**30}", keys["viewer"])) == "validation"


def test_it_signals_a_waiting_run_and_refuses_a_finished_one(keys):
    run = waiting_run()
    sent = call("post", f"/runs/{run.id}/signal", keys["operator"], {"name": "paid", "payload": {"amount": 5}})
    assert sent.status_code == 202 and sent.json()["run"]["id"] == str(run.id)
    assert sent.json()["run"]["input"] == {"id": "o-1", "password": MARK}  # redacted as the console shows it
    assert JournalEntry.objects.filter(run=run, kind="signal_received", name="paid").count() == 1
    entry = AuditEntry.objects.get(action="run.signal", outcome="ok")
    assert entry.object_id == str(run.id) and entry.reason == "paid" and entry.tenant == "default"

    assert problem(call("post", f"/runs/{run.id}/signal", keys["operator"], {"name": "a\x00b"})) == "validation"
    assert problem(call("post", f"/runs/{run.id}/signal", keys["operator"], {"name": ""})) == "validation"
    assert problem(call("post", f"/runs/{run.id}/signal", keys["operator"], {"name": "x" * 5000})) == "validation"
    done = make_run(status=RunStatus.COMPLETED, reason="")
    finished = call("post", f"/runs/{done.id}/signal", keys["operator"], {"name": "paid"})
    assert finished.status_code == 409 and problem(finished) == "conflict" and "COMPLETED" in finished.json()["detail"]
    assert problem(call("post", f"/runs/{run.id}/signal", keys["acme-operator"], {"name": "paid"})) == "not-found"
    assert AuditEntry.objects.filter(action="run.signal", outcome="denied", tenant="default").count() == 1
    assert JournalEntry.objects.filter(kind="signal_received").count() == 1


def test_it_cancels_only_with_the_state_the_caller_saw(keys):
    run = waiting_run()
    path = f"/runs/{run.id}/cancel"
    missing = call("post", path, keys["operator"], {"reason": "withdrawn", "compensate": False})
    assert missing.status_code == 400 and problem(missing) == "validation" and "expected" in missing.json()["detail"]
    stale = call("post", path, keys["operator"], {"reason": "withdrawn", "compensate": False, "expected": "RUNNING"})
    assert stale.status_code == 409 and problem(stale) == "stale-state"
    assert "now WAITING" in stale.json()["detail"] and "you saw RUNNING" in stale.json()["detail"]
    assert WorkflowRun.objects.get(id=run.id).status == RunStatus.WAITING
    assert AuditEntry.objects.filter(action="run.cancel", outcome="refused").count() == 2

    done = call("post", path, keys["operator"], {"reason": "withdrawn", "compensate": False, "expected": "WAITING"})
    assert done.status_code == 200 and done.json()["run"]["status"] == "CANCELLED"
    assert done.json()["message"] == "cancelled; the run is now CANCELLED"
    again = call("post", path, keys["operator2"], {"reason": "withdrawn", "compensate": False, "expected": "WAITING"})
    assert problem(again) == "stale-state" and "now CANCELLED" in again.json()["detail"]
    retry = call("post", f"/runs/{run.id}/retry", keys["operator"], {"reason": "go", "expected": "CANCELLED"})
    assert retry.status_code == 409 and problem(retry) == "conflict"
    nobody = call("post", "/runs/00000000-0000-0000-0000-000000000000/cancel", keys["operator"],
                  {"reason": "withdrawn", "compensate": True, "expected": "WAITING"})
    assert problem(nobody) == "not-found" and "no run" in nobody.json()["detail"]


def test_a_tenant_limited_key_starts_runs_in_its_tenant_only(keys):
    body = {"workflow": "api_gate", "input": {"id": "t-1"}, "tenant": "globex"}
    refused = call("post", "/runs", keys["acme-operator"], body)
    assert refused.status_code == 403 and problem(refused) == "forbidden" and "globex" in refused.json()["detail"]
    denied = AuditEntry.objects.get(action="run.start", outcome="denied")
    assert denied.tenant == "globex" and denied.actor_label == "system: api key acme-operator"
    assert not WorkflowRun.objects.exists()
    assert call("post", "/runs", keys["acme-operator"], {**body, "tenant": "acme"}).status_code == 201


@pytest.mark.parametrize("raw, expected", [
    pytest.param(b"{not json", 400, id="malformed"),
    pytest.param(b'{"workflow": "<script>alert(1)</script>", "input": 1}', 404, id="markup"),
    pytest.param(b'{"workflow": "api_gate", "version": ' + str(10**30).encode() + b"}", 400, id="huge-int"),
    pytest.param(b'{"workflow": "api_gate", "input": "\\u0000"}', 400, id="nul-input"),
    pytest.param(b'{"workflow": "' + b"w" * 5000 + b'"}', 400, id="5000-chars"),
    pytest.param(b'{"workflow": "api_gate", "business_key": "a\\u0000b"}', 400, id="nul-key"),
    pytest.param(b'{"workflow": "api_gate", "tenant": "' + b"t" * 5000 + b'"}', 400, id="5000-char-tenant"),
    pytest.param(b'{"workflow": "api_gate", "input": ' + b"[" * 200 + b"]" * 200 + b"}", 400, id="deep"),
    pytest.param(b"[1, 2, 3]", 400, id="not-an-object"),
    pytest.param(b'{"workflow": "api_gate", "budget": {"max_steps": ' + str(10**30).encode() + b"}}", 400,
                 id="huge-steps"),
    pytest.param(b'{"workflow": "api_gate", "budget": {"max_cost": Infinity}}', 400, id="infinite-cost"),
    pytest.param(b'{"workflow": "api_gate", "input": NaN}', 400, id="nan-input"),
    pytest.param(b'{"workflow": "api_gate", "budget": {"max_duration_s": 1e308}}', 400, id="huge-duration"),
])
def test_it_answers_hostile_input_with_problem_json_never_a_500(raw, expected, keys):
    answer = call("post", "/runs", keys["operator"], raw=raw)
    assert answer.status_code == expected, answer.content[:500]
    problem(answer)  # problem JSON, never an HTML page
    assert not WorkflowRun.objects.exists()


def test_every_action_answers_hostile_bodies_with_a_400_problem(keys):
    run = waiting_run()
    approval, effect = approval_of(run), make_effect()
    actions = {
        f"/runs/{run.id}/signal": {"name": "paid"},
        f"/runs/{run.id}/cancel": {"reason": "r", "compensate": False, "expected": "WAITING"},
        f"/runs/{run.id}/retry": {"reason": "r", "expected": "NEEDS_ATTENTION"},
        f"/runs/{run.id}/compensate": {"reason": "r", "expected": "WAITING"},
        f"/approvals/{approval.id}/decide": {"approve": False, "comment": "c", "expected": "PENDING"},
        f"/effects/{effect.id}/resolve": {"outcome": "failed", "note": "n", "expected": "UNKNOWN"},
    }
    text_field = {"signal": "name", "cancel": "reason", "retry": "reason", "compensate": "reason",
                  "decide": "comment", "resolve": "note"}
    for path, body in actions.items():
        key = keys["approver"] if "approvals" in path else keys["operator"]
        field = text_field[path.rsplit("/", 1)[1]]
        for hostile in (b"{not json", b"null", b'"x"', *(
                json.dumps({**body, field: value}).encode()
                for value in ("a\x00b", "x" * 5000, 10**30, {"<b>": "</b>"}))):
            answer = call("post", path, key, raw=hostile)
            assert answer.status_code == 400 and problem(answer) == "validation", (path, hostile[:60], answer.content)
    assert WorkflowRun.objects.get(id=run.id).status == RunStatus.WAITING
    assert approval_of(run).state == "PENDING" and EffectRecord.objects.get(id=effect.id).status == "UNKNOWN"


def test_it_refuses_a_body_over_djangos_limit_as_payload_too_large(keys, settings):
    """DATA_UPLOAD_MAX_MEMORY_SIZE (Django's default: 2.5 MiB) bounds every API body: over it,
    413 problem JSON. A 2 MiB input is under it, and within the engine's 10 MiB: it starts."""
    big = b'{"workflow": "api_gate", "input": {"id": "' + b"x" * (2 * 1024 * 1024) + b'"}}'
    assert call("post", "/runs", keys["operator"], raw=big).status_code == 201
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    answer = call("post", "/runs", keys["operator"], raw=big.replace(b'"api_gate"', b'"api_gate", "business_key": "b"'))
    assert answer.status_code == 413 and problem(answer) == "payload-too-large" and "1048576" in answer.json()["detail"]
    assert WorkflowRun.objects.count() == 1


def test_a_run_continued_as_new_links_to_its_successor_both_ways(keys):
    first = make_run(status=RunStatus.COMPLETED, reason="continued_as_new", business_key="loop-1")
    second = make_run(status=RunStatus.RUNNING, reason="", business_key="loop-1#2")
    WorkflowRun.objects.filter(id=first.id).update(continued_to=second.id)
    WorkflowRun.objects.filter(id=second.id).update(continued_from=first.id)

    old = call("get", f"/runs/{first.id}", keys["viewer"]).json()
    new = call("get", f"/runs/{second.id}", keys["viewer"]).json()
    assert old["continued_to"] == str(second.id) and old["continued_from"] is None
    assert new["continued_from"] == str(first.id) and new["continued_to"] is None


def test_a_signal_to_a_run_that_continued_as_new_goes_to_the_run_continuing_it(keys):
    first = make_run(status=RunStatus.COMPLETED, reason="continued_as_new", business_key="loop-2")
    second = make_run(status=RunStatus.WAITING, reason="", business_key="loop-2#2")
    WorkflowRun.objects.filter(id=first.id).update(continued_to=second.id)
    WorkflowRun.objects.filter(id=second.id).update(continued_from=first.id)

    sent = call("post", f"/runs/{first.id}/signal", keys["operator"], {"name": "paid", "payload": {"n": 1}})
    assert sent.status_code == 202 and sent.json()["run"]["id"] == str(second.id)
    assert str(second.id) in sent.json()["message"]
    assert JournalEntry.objects.filter(run=second, kind="signal_received", name="paid").count() == 1
    assert AuditEntry.objects.get(action="run.signal").after["delivered_to"] == str(second.id)

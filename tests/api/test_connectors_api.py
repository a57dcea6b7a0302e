"""Connectors' flow control over the HTTP API (``/connectors``): each connector's state and its
circuit's history; pause, resume and limits with the operator role, a key that sees every tenant,
the state the caller saw and an audit entry; malformed limits refused naming the field."""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.flow import gate, services
from ledger.models import ConnectorFlow
from operators.models import AuditEntry
from tests.api.actions_data import call, problem

pytestmark = pytest.mark.django_db

NAME = "payments.capture"
LIMITS = {"rate": 20.0, "burst": 5, "max_in_flight": 3, "key_field": "tenant", "circuit_failures": 4,
          "circuit_window_seconds": 30.0, "circuit_cooldown_seconds": 15.0}


@pytest.fixture
def flows(keys):
    """Every registered connector's flow row, as a worker writes them at start-up."""
    assert services.sync_declared() >= 2
    return keys


def _flow() -> ConnectorFlow:
    return ConnectorFlow.objects.get(connector=NAME)


def _audit(action: str) -> list[tuple[str, str]]:
    return list(AuditEntry.objects.filter(action=action).order_by("id").values_list("outcome", "actor_label"))


def test_it_lists_every_connector_and_shows_one_with_its_circuit_history(flows):
    listed = call("get", "/connectors", flows["viewer"])
    assert listed.status_code == 200
    names = [c["connector"] for c in listed.json()]
    assert names == sorted(names) and {NAME, "email.send", "webhook.post"} <= set(names)
    capture = next(c for c in listed.json() if c["connector"] == NAME)
    assert capture["state"] == "running" and capture["paused"] is None
    assert capture["limits"] == capture["declared"] and capture["limits_changed_by"] is None
    assert capture["circuit"] == {"state": "closed", "failures": 0, "opened_at": None, "keys_open": 0}

    with transaction.atomic():  # the circuit opens on a failure whose text is the provider's
        gate.circuit_changed(NAME, "acme", "open", failures=5, at=timezone.now(),
                             error="HTTP 503 <script>alert(1)</script> Authorization: Bearer sk_live_abcdefghijklmnop")
    one = call("get", f"/connectors/{NAME}", flows["viewer"])
    assert one.status_code == 200
    [change] = one.json()["changes"]
    assert (change["state"], change["key"], change["failures"]) == ("open", "acme", 5)
    assert change["error"].startswith("HTTP 503 <script>") and "sk_live_abcdefghijklmnop" not in change["error"]
    assert one["Content-Type"].startswith("application/json")  # never markup: the text as the provider sent it
    # A key limited to some tenants sees the connector, not another tenant's key or error.
    [limited] = call("get", f"/connectors/{NAME}", flows["acme-operator"]).json()["changes"]
    assert (limited["state"], limited["key"], limited["error"]) == ("open", None, None)

    for unknown in ("no.such.connector", "%3Cb%3E"):
        missing = call("get", f"/connectors/{unknown}", flows["viewer"])
        assert missing.status_code == 404 and problem(missing) == "not-found"
        assert "no connector named" in missing.json()["detail"]


def test_a_key_pauses_and_resumes_a_connector_with_the_state_it_saw(flows):
    path, body = f"/connectors/{NAME}/pause", {"reason": "PSP incident INC-42", "expected": "running"}
    assert problem(call("post", path, flows["operator"], {"reason": "x"})) == "validation"  # no expected

    viewer = call("post", path, flows["viewer"], body)
    assert viewer.status_code == 403 and problem(viewer) == "forbidden" and "operator" in viewer.json()["detail"]
    tenant = call("post", path, flows["acme-operator"], body)
    assert tenant.status_code == 403 and "every tenant" in tenant.json()["detail"]
    assert _flow().paused_at is None

    done = call("post", path, flows["operator"], body)
    assert done.status_code == 200, done.content
    paused = done.json()["connector"]
    assert paused["state"] == "paused"
    assert (paused["paused"]["by"], paused["paused"]["reason"]) == ("system: api key operator", "PSP incident INC-42")
    entry = AuditEntry.objects.get(action="connector.pause", outcome="ok")
    assert (entry.object_type, entry.object_id, entry.reason) == ("connector", NAME, "PSP incident INC-42")
    assert (entry.before["state"], entry.after["state"]) == ("running", "paused")

    stale = call("post", path, flows["operator2"], body)  # it saw the connector running: it is paused now
    assert stale.status_code == 409 and problem(stale) == "stale-state"
    assert "now paused by system: api key operator" in stale.json()["detail"]
    twice = call("post", path, flows["operator2"], {**body, "expected": "paused"})
    assert twice.status_code == 409 and problem(twice) == "conflict"
    assert twice.json()["detail"].startswith(f"{NAME} is already paused (by system: api key operator at ")

    resume = f"/connectors/{NAME}/resume"
    resumed = call("post", resume, flows["operator"], {"reason": "PSP back", "expected": "paused"})
    assert resumed.status_code == 200 and resumed.json()["connector"]["state"] == "running"
    assert _flow().paused_at is None
    again = call("post", resume, flows["operator"], {"reason": "PSP back", "expected": "running"})
    assert again.status_code == 409 and again.json()["detail"] == f"{NAME} is not paused"

    assert _audit("connector.pause") == [
        ("refused", "system: api key operator"), ("denied", "system: api key viewer"),
        ("denied", "system: api key acme-operator"), ("ok", "system: api key operator"),
        ("refused", "system: api key operator2"), ("refused", "system: api key operator2")]
    assert _audit("connector.resume") == [("ok", "system: api key operator"), ("refused", "system: api key operator")]


def test_it_sets_every_limit_then_puts_the_declared_ones_back(flows):
    declared = call("get", f"/connectors/{NAME}", flows["viewer"]).json()["declared"]
    path = f"/connectors/{NAME}/limits"
    assert problem(call("put", path, flows["viewer"], {**LIMITS, "reason": "r", "expected": "running"})) \
        == "forbidden"
    assert problem(call("put", path, flows["acme-operator"], {**LIMITS, "reason": "r", "expected": "running"})) \
        == "forbidden"

    done = call("put", path, flows["operator"], {**LIMITS, "reason": "the PSP's new quota", "expected": "running"})
    assert done.status_code == 200, done.content
    shown = done.json()["connector"]
    assert shown["limits"] == LIMITS and shown["declared"] == declared
    assert shown["limits_changed_by"] == "system: api key operator"
    entry = AuditEntry.objects.get(action="connector.limits", outcome="ok")
    assert entry.before["limits"] == declared and entry.after["limits"] == LIMITS
    assert _flow().rate == 20.0 and _flow().max_in_flight == 3

    unlimited = call("put", path, flows["operator"], {**LIMITS, "rate": None, "max_in_flight": None,
                                                      "reason": "no quota", "expected": "running"})
    assert unlimited.status_code == 200
    assert (_flow().rate, _flow().max_in_flight) == (None, None)

    back = call("put", path, flows["operator"], {"declared": True, "reason": "incident over", "expected": "running"})
    assert back.status_code == 200, back.content
    assert back.json()["connector"]["limits"] == declared
    assert back.json()["connector"]["limits_changed_by"] is None
    assert [o for o, _ in _audit("connector.limits")] == ["denied", "denied", "ok", "ok", "ok"]


def test_a_limits_change_made_since_the_version_the_caller_saw_is_refused(flows):
    path, seen = f"/connectors/{NAME}/limits", call("get", f"/connectors/{NAME}", flows["viewer"]).json()
    body = {**LIMITS, "reason": "new quota", "expected": "running", "limits_version": seen["limits_version"]}
    done = call("put", path, flows["operator"], body)
    assert done.status_code == 200 and done.json()["connector"]["limits_version"] != seen["limits_version"]
    twice = call("put", path, flows["operator2"], {**body, "rate": 5.0})  # saw the limits before that change
    assert twice.status_code == 409 and problem(twice) == "stale-state"
    assert "limits were changed by system: api key operator" in twice.json()["detail"]
    assert _flow().rate == 20.0
    assert problem(call("put", path, flows["operator"], {**body, "limits_version": "not hex"})) == "validation"
    assert [o for o, _ in _audit("connector.limits")] == ["ok", "refused"]


@pytest.mark.parametrize(("change", "field"), [
    pytest.param({"burst": 0}, "burst", id="burst-zero"),
    pytest.param({"burst": 1.5}, "burst", id="burst-fraction"),
    pytest.param({"burst": "5"}, "burst", id="burst-text"),
    pytest.param({"burst": True}, "burst", id="burst-bool"),
    pytest.param({"burst": None}, "burst", id="burst-null"),
    pytest.param({"rate": -1}, "rate", id="rate-negative"),
    pytest.param({"rate": 0}, "rate", id="rate-zero"),
    pytest.param({"rate": 1e12}, "rate", id="rate-huge"),
    pytest.param({"rate": "fast"}, "rate", id="rate-text"),
    pytest.param({"max_in_flight": 0}, "max_in_flight", id="in-flight-zero"),
    pytest.param({"max_in_flight": 10**30}, "max_in_flight", id="in-flight-huge"),
    pytest.param({"key_field": "a b"}, "key_field", id="key-space"),
    pytest.param({"key_field": "<script>"}, "key_field", id="key-markup"),
    pytest.param({"key_field": "k" * 101}, "key_field", id="key-long"),
    pytest.param({"circuit_failures": -1}, "circuit_failures", id="failures-negative"),
    pytest.param({"circuit_window_seconds": 0}, "circuit_window_seconds", id="window-zero"),
    pytest.param({"circuit_cooldown_seconds": 86_401}, "circuit_cooldown_seconds", id="cooldown-day"),
    pytest.param({"circuit_cooldown_seconds": None}, "circuit_cooldown_seconds", id="cooldown-null"),
    pytest.param({"declared": True}, "rate", id="declared-with-limits"),
])
def test_it_refuses_a_malformed_limit_naming_the_field_and_changes_nothing(flows, change, field):
    before = call("get", f"/connectors/{NAME}", flows["viewer"]).json()
    answer = call("put", f"/connectors/{NAME}/limits", flows["operator"],
                  {**LIMITS, **change, "reason": "r", "expected": "running"})
    assert answer.status_code == 400 and problem(answer) == "validation", answer.content
    named = [str(part) for error in answer.json().get("errors", []) for part in error["loc"]]
    assert field in named or answer.json()["detail"].startswith(f"{field}:"), answer.json()
    assert call("get", f"/connectors/{NAME}", flows["viewer"]).json() == before
    assert not AuditEntry.objects.filter(action="connector.limits").exists()


def test_it_refuses_a_limit_left_out_or_not_a_number_at_all(flows):
    path = f"/connectors/{NAME}/limits"
    partial = call("put", path, flows["operator"], {"rate": 5, "reason": "r", "expected": "running"})
    assert partial.status_code == 400 and partial.json()["detail"].startswith("burst: required")
    for raw in (b'{"rate": NaN}', b'{"rate": Infinity}'):
        body = json.dumps({**LIMITS, "reason": "r", "expected": "running"}).replace('"rate": 20.0', raw[1:-1].decode())
        answer = call("put", path, flows["operator"], raw=body.encode())
        assert answer.status_code == 400 and problem(answer) == "validation", answer.content
    assert _flow().changed_by_label == "" and not AuditEntry.objects.filter(action__startswith="connector.").exists()


def test_an_unknown_connector_is_a_404_problem_for_every_action(flows):
    for method, action, body in (("post", "pause", {"reason": "r", "expected": "running"}),
                                 ("post", "resume", {"reason": "r", "expected": "paused"}),
                                 ("put", "limits", {"declared": True, "reason": "r", "expected": "running"})):
        answer = call(method, f"/connectors/no.such.connector/{action}", flows["operator"], body)
        assert answer.status_code == 404 and problem(answer) == "not-found", (action, answer.content)
    assert not AuditEntry.objects.filter(action__startswith="connector.").exists()


# --- the same through the Python API (``ledger``), which writes no audit entry ------------------


def test_the_python_api_pauses_resumes_and_sets_limits_as_the_http_api_shows_them(flows):
    from ledger import (
        ConnectorPauseState,
        InvalidFlowSetting,
        connector_state,
        connector_states,
        pause_connector,
        resume_connector,
        set_connector_limits,
    )

    assert NAME in [s.connector for s in connector_states()] and connector_state("no.such.connector") is None
    paused = pause_connector(NAME, reason="PSP incident INC-42", by="oncall")
    assert (paused.state, paused.paused_by, paused.paused_reason) == ("paused", "oncall", "PSP incident INC-42")
    assert call("get", f"/connectors/{NAME}", flows["viewer"]).json()["paused"]["by"] == "oncall"
    with pytest.raises(ConnectorPauseState, match=r"already paused \(by oncall at "):
        pause_connector(NAME, reason="again", by="someone else")
    assert resume_connector(NAME, reason="PSP back", by="oncall").state == "running"
    with pytest.raises(ConnectorPauseState, match="is not paused"):
        resume_connector(NAME, reason="again", by="oncall")

    declared = connector_state(NAME).as_dict()["declared"]
    changed = set_connector_limits(NAME, by="oncall", rate=20, burst=5)
    assert changed.as_dict()["limits"] == {**declared, "rate": 20, "burst": 5}  # the others kept
    assert (changed.changed_by, call("get", f"/connectors/{NAME}", flows["viewer"]).json()["limits"]["rate"]) \
        == ("oncall", 20.0)
    assert set_connector_limits(NAME, by="oncall", rate=None).rate is None
    for bad, says in (({"burst": 0}, "burst must be between 1"), ({}, "give at least one limit"),
                      ({"declared": True, "rate": 1.0}, "do not give rate"),
                      ({"max_in_flight": True}, "calls in flight must be a number")):
        with pytest.raises(InvalidFlowSetting, match=says):
            set_connector_limits(NAME, by="oncall", **bad)
    assert connector_state(NAME).burst == 5  # nothing was changed by the refusals
    back = set_connector_limits(NAME, by="oncall", declared=True)
    assert back.as_dict()["limits"] == declared and back.changed_by == ""
    with pytest.raises(LookupError):
        pause_connector("no.such.connector", reason="r", by="oncall")
    with pytest.raises(LookupError):
        set_connector_limits("no.such.connector", by="oncall", rate=1.0)
    assert not AuditEntry.objects.filter(action__startswith="connector.").exists()

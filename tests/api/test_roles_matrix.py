"""Every endpoint of the API's actions for every kind of caller: no key, a wrong key, a revoked
key, and a key of each role. A role's refusal is a 403 problem and is in the audit log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from api.keys import apikey_create, apikey_revoke
from api.models import ApiKey
from ledger.flow import services as flow
from operators.models import AuditEntry
from sagas.models import RunStatus
from tests.api.actions_data import approval_of, call, problem, waiting_run
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db


@dataclass
class World:
    waiting: Any  # an api_gate run, WAITING for its approval
    attention: Any  # NEEDS_ATTENTION (model_unavailable): retryable
    stuck: Any  # NEEDS_ATTENTION (effect_unknown): compensable
    approval: Any
    effect: Any


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: Callable[[World], str]
    body: Callable[[World], Any]
    action: str  # "" for reads
    allowed: tuple[str, ...]  # the roles it answers with `ok`
    ok: int


READ = ("viewer", "operator", "approver")
ENDPOINTS = {
    "list runs": Endpoint("get", lambda w: "/runs?status=WAITING", lambda w: None, "", READ, 200),
    "history": Endpoint("get", lambda w: f"/runs/{w.waiting.id}/history", lambda w: None, "", READ, 200),
    "start": Endpoint("post", lambda w: "/runs", lambda w: {"workflow": "api_gate", "input": {"id": "m-9"}},
                      "run.start", ("operator",), 201),
    "signal": Endpoint("post", lambda w: f"/runs/{w.waiting.id}/signal", lambda w: {"name": "paid", "payload": 1},
                       "run.signal", ("operator",), 202),
    "cancel": Endpoint("post", lambda w: f"/runs/{w.waiting.id}/cancel",
                       lambda w: {"reason": "customer withdrew", "compensate": False, "expected": "WAITING"},
                       "run.cancel", ("operator",), 200),
    "compensate": Endpoint("post", lambda w: f"/runs/{w.stuck.id}/compensate",
                           lambda w: {"reason": "undo it", "expected": "NEEDS_ATTENTION"},
                           "run.compensate", ("operator",), 200),
    "retry": Endpoint("post", lambda w: f"/runs/{w.attention.id}/retry",
                      lambda w: {"reason": "the model is back", "expected": "NEEDS_ATTENTION"},
                      "run.retry", ("operator",), 200),
    "list approvals": Endpoint("get", lambda w: "/approvals?state=PENDING", lambda w: None, "", READ, 200),
    "decide": Endpoint("post", lambda w: f"/approvals/{w.approval.id}/decide",
                       lambda w: {"approve": True, "comment": "ok", "expected": "PENDING"},
                       "approval.approve", ("approver",), 200),
    "list effects": Endpoint("get", lambda w: "/effects?status=UNKNOWN", lambda w: None, "", READ, 200),
    "resolve": Endpoint("post", lambda w: f"/effects/{w.effect.id}/resolve",
                        lambda w: {"outcome": "succeeded", "downstream_ref": "ch_1", "note": "dashboard shows ch_1",
                                   "expected": "UNKNOWN"},
                        "effect.resolve", ("operator",), 200),
    "list connectors": Endpoint("get", lambda w: "/connectors", lambda w: None, "", READ, 200),
    "connector": Endpoint("get", lambda w: "/connectors/payments.capture", lambda w: None, "", READ, 200),
    "pause connector": Endpoint("post", lambda w: "/connectors/payments.capture/pause",
                                lambda w: {"reason": "PSP incident", "expected": "running"},
                                "connector.pause", ("operator",), 200),
    "resume connector": Endpoint("post", lambda w: "/connectors/email.send/resume",
                                 lambda w: {"reason": "relay back", "expected": "paused"},
                                 "connector.resume", ("operator",), 200),
    "connector limits": Endpoint("put", lambda w: "/connectors/payments.capture/limits",
                                 lambda w: {"declared": True, "reason": "incident over", "expected": "running"},
                                 "connector.limits", ("operator",), 200),
    "list spend limits": Endpoint("get", lambda w: "/spend-limits", lambda w: None, "", READ, 200),
    "spend limit": Endpoint("put", lambda w: "/spend-limits/acme/model",
                            lambda w: {"per_day": 25, "reason": "finance approved it", "expected": "none"},
                            "connector.spend_limit", ("operator",), 200),
}


@pytest.fixture
def world(keys) -> World:
    flow.sync_declared()  # the connectors' flow rows, as a worker writes them at start-up
    flow.connector_pause(connector="email.send", by="ops", reason="the mail relay is down")
    waiting = waiting_run()
    return World(waiting=waiting, approval=approval_of(waiting),
                 attention=make_run(status=RunStatus.NEEDS_ATTENTION, reason="model_unavailable"),
                 stuck=make_run(status=RunStatus.NEEDS_ATTENTION, reason="effect_unknown"),
                 effect=make_effect())


@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_it_answers_each_caller_as_its_role_allows(name, keys, world):
    endpoint = ENDPOINTS[name]
    revoked_model, revoked = apikey_create(name="revoked", role="operator")
    apikey_revoke(key=revoked_model, by="test")
    path, body = endpoint.path(world), endpoint.body(world)

    for label, key in (("anonymous", None), ("wrong key", keys["operator"][:-3] + "xyz"), ("revoked", revoked)):
        answer = call(endpoint.method, path, key, body)
        assert answer.status_code == 401, (label, answer.content)
        assert problem(answer) == "unauthenticated" and answer["WWW-Authenticate"].startswith("Bearer")

    # the refused roles first, so the allowed one acts on an object nobody touched
    for role in sorted(READ, key=lambda r: r in endpoint.allowed):
        answer = call(endpoint.method, path, keys[role], body)
        if role in endpoint.allowed:
            assert answer.status_code == endpoint.ok, (role, answer.content)
            assert answer["Content-Type"].startswith("application/json")
            if endpoint.action:
                assert AuditEntry.objects.filter(action=endpoint.action, outcome="ok",
                                                 actor_label=f"system: api key {role}").count() == 1
        else:
            assert answer.status_code == 403, (role, answer.content)
            assert problem(answer) == "forbidden" and endpoint.action.split(".")[0] in answer.json()["detail"]
            denied = AuditEntry.objects.get(action=endpoint.action, outcome="denied",
                                            actor_label=f"system: api key {role}")
            assert denied.actor == ApiKey.objects.get(name=role).user
    # nothing was audited for the callers without a valid key
    assert not AuditEntry.objects.filter(actor_label__contains="revoked").exists()

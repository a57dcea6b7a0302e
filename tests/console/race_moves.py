"""The moves of the race tests: workflows and connectors of their own, runs and effects to race
over, one POST of one person (``Move``), and sending several at the same moment (``race``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection
from django.test import Client
from django.urls import reverse

from ledger import Connector, Timeout, connector
from ledger.models import EffectRecord
from operators.models import AuditEntry
from sagas import Context, start, workflow
from sagas.models import (
    ApprovalRequest,
    RunStatus,
    WorkflowRun,
)
from sagas.replay.engine import advance
from tests.console.conftest import client_for

ROUNDS = 20


@connector("race.charge")
class RaceCharge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}"}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("race.blind")
class RaceBlind(Connector):
    """No lookup, not idempotent: a timeout leaves the effect UNKNOWN for a person."""

    def execute(self, payload, *, key):
        raise Timeout("no answer within 2.0 s")


@workflow("race_charge_wait", version=1)
def race_charge_wait(ctx: Context, order: dict) -> dict:
    ctx.effect("charge", "race.charge", {"order": order["id"], "amount_cents": 900})
    ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(hours=1))
    return {"shipped": order["id"]}


@workflow("race_expiring", version=1)
def race_expiring(ctx: Context, order: dict) -> dict:
    ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(milliseconds=1))
    return {"shipped": order["id"]}


@workflow("race_unknown", version=1)
def race_unknown(ctx: Context, order: dict) -> dict:
    ctx.effect("capture", "race.blind", {"order": order["id"]})
    return {"captured": order["id"]}


def waiting_run(key: str) -> tuple[WorkflowRun, ApprovalRequest]:
    """A WAITING run with a SUCCEEDED charge (something to compensate) and a PENDING approval."""
    run = start("race_charge_wait", {"id": key}, business_key=key)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    return run, ApprovalRequest.objects.get(run=run)


def unknown_effect(key: str) -> EffectRecord:
    run = start("race_unknown", {"id": key}, business_key=key)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "effect_unknown")
    return EffectRecord.objects.get(run_id=run.id)


@dataclass
class Move:
    """One POST: who, where, what they saw (``expected``) and which audit entry it leaves."""

    who: str
    kind: str
    url: str
    form: dict[str, str]
    action: str
    object_type: str
    object_id: str
    expected: str
    response: Any = field(default=None, repr=False)

    def current_state(self) -> str:
        if self.object_type == "run":
            return WorkflowRun.objects.get(id=self.object_id).status
        if self.object_type == "approval":
            return ApprovalRequest.objects.get(id=self.object_id).state
        return EffectRecord.objects.get(id=int(self.object_id)).status

    def audit(self) -> list[AuditEntry]:
        return list(AuditEntry.objects.filter(action=self.action, object_type=self.object_type,
                                              object_id=self.object_id).order_by("id"))


def run_move(who: str, kind: str, run: WorkflowRun) -> Move:
    reason = f"{kind} by {who}: customer asked on ticket 4411"
    if kind == "cancel":
        return Move(who, kind, reverse("console:run_cancel", args=[run.id]),
                    {"reason": reason, "expected": run.status}, "run.cancel", "run", str(run.id), run.status)
    if kind == "cancel_compensate":
        return Move(who, kind, reverse("console:run_cancel", args=[run.id]),
                    {"reason": reason, "expected": run.status, "compensate": "on"}, "run.cancel", "run",
                    str(run.id), run.status)
    assert kind == "compensate"
    return Move(who, kind, reverse("console:run_compensate", args=[run.id]),
                {"reason": reason, "expected": run.status}, "run.compensate", "run", str(run.id), run.status)


def decide_move(who: str, kind: str, approval: ApprovalRequest) -> Move:
    return Move(who, kind, reverse("console:approval_decide", args=[approval.id]),
                {"decision": kind, "comment": f"{kind} by {who}", "expected": approval.state,
                 **({"confirm": "compensate"} if kind == "reject" else {})},
                f"approval.{kind}", "approval", str(approval.id), approval.state)


def resolve_move(who: str, outcome: str, effect: EffectRecord) -> Move:
    form = {"outcome": outcome, "note": f"{who} checked the provider dashboard", "expected": effect.status}
    if outcome == "succeeded":
        form["downstream_ref"] = f"ch-{who}"
    return Move(who, f"resolve_{outcome}", reverse("console:effect_resolve", args=[effect.id]), form,
                "effect.resolve", "effect", str(effect.id), effect.status)


def race(clients: dict[str, Client], *moves: Move) -> None:
    """Send the moves' POSTs at the same moment, one thread (and DB connection) each."""
    barrier = threading.Barrier(len(moves))
    errors: list[BaseException] = []

    def go(move: Move) -> None:
        try:
            barrier.wait(timeout=60)
            move.response = clients[move.who].post(move.url, move.form)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(m,), name=f"race-{m.who}") for m in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racing request hung"
    assert not errors, errors


def describe(move: Move) -> str:
    response = move.response
    detail = ""
    if response.status_code >= 500 and getattr(response, "exc_info", None):
        detail = f": {response.exc_info[1]!r}"
    return f"{move.who} {move.kind} -> {response.status_code}{detail}"


def clients_for(people) -> dict[str, Client]:
    clients = {}
    for user in people.values():
        client = client_for(user)
        client.raise_request_exception = False  # a crash must show as the 500 a browser would get
        clients[user.get_username()] = client
    return clients

"""The demo's order agent (``order_agent`` version 2, ``demo/agent.py``) end to end: real worker
processes, the real simulated providers and their model gateway, a real crash of a worker
between a billed model turn and its journal entry, and a person's decision on the shipment."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from demo.loadgen import make_order
from demo.providers.selectors import executions, replays
from sagas import approvals, approve, reject, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.ledger.conftest import stack  # noqa: F401  (the providers process, and workers pointed at it)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = "demo.workflows"


def user(name: str):
    return get_user_model().objects.create_user(name, password="pw-" + name)


def wait_status(run, wanted: str, timeout: float = 60) -> WorkflowRun:
    def reached():
        run.refresh_from_db()
        return run.status == wanted

    wait_until(reached, timeout, interval=0.1, what=f"run {run.id} to be {wanted}")
    return run


def an_order(n: int) -> dict:
    return make_order(n, "agent", random.Random(n))


def gateway_bills(run) -> dict[str, Decimal]:
    """What the model gateway billed for the run's turns, by Idempotency-Key."""
    rows = executions("model", "complete").filter(idempotency_key__startswith=f"{run.id}:")
    return {r.idempotency_key: Decimal(str(r.response["cost"])) for r in rows}


def test_it_waits_for_the_shipment_approval_then_completes_each_tool_once_and_each_turn_billed_once(
    stack,  # noqa: F811
):
    order = an_order(1)
    run = start("order_agent", order, business_key=order["id"], tenant="acme", started_by=user("sam"))
    assert run.version == 2
    # w1 dies right after the gateway billed turn 2 and before the turn was journaled.
    first = stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url, SAGAS_CRASH_AT="after_step:order.model#2")
    wait_until(lambda: not first.alive(), 60, what="w1 to die after turn 2 was billed")
    stack.procs.worker("w2", MODULES, DEMO_PROVIDERS_URL=stack.url)

    wait_status(run, RunStatus.WAITING, timeout=90)
    [gate] = approvals(run.id)
    assert (gate.step, gate.state) == ("approve:ship_order", "PENDING")
    assert "shipping.create" in gate.reason
    assert executions("payments", "capture").count() == 1 and executions("inventory", "reserve").count() == 1
    assert executions("shipping", "create").count() == 0  # nothing shipped before a person said yes

    approve(run_id=run.id, name="approve:ship_order", user=user("ann"), comment="address checked")
    wait_status(run, RunStatus.COMPLETED)

    # Every tool acted once at its provider, though turn 2 ran twice and the run was replayed
    # after the approval.
    for provider, operation in (("payments", "capture"), ("inventory", "reserve"), ("shipping", "create"),
                                ("email", "send")):
        assert executions(provider, operation).count() == 1, (provider, operation)
    capture = executions("payments", "capture").get()
    shipment = executions("shipping", "create").get()
    assert capture.request == {"order": order["id"], "amount_cents": order["amount_cents"], "currency": "EUR"}
    assert shipment.request["address"] == order["address"]
    mail = executions("email", "send").get().request
    assert mail["to"] == order["email"] and shipment.response["shipment_id"] in mail["body"]
    assert run.result == {"order": order["id"], "summary": run.result["summary"],
                          "charge": capture.response["transaction_id"], "shipment": shipment.response["shipment_id"]}

    # Six model turns, each billed once under its turn's key: turn 2's repeat was answered from
    # the gateway's cache. The run was charged what the gateway billed.
    bills = gateway_bills(run)
    assert sorted(bills) == sorted(f"{run.id}:order:turn-{n}" for n in range(1, 7))
    assert [r.execution.idempotency_key for r in replays("model", "complete")] == [f"{run.id}:order:turn-2"]
    print(f"order agent run: {len(bills)} turns, cost {run.cost_used} usd, gateway billed {sum(bills.values())} usd")
    assert run.cost_used > 0
    assert abs(run.cost_used - sum(bills.values())) < Decimal("0.00001")
    turns = list(JournalEntry.objects.filter(run=run, kind="step", name__startswith="order.model")
                 .order_by("seq").values_list("payload", flat=True))
    assert [t["value"]["turn"] for t in turns] == [1, 2, 3, 4, 5, 6]
    assert {t["value"]["model"] for t in turns} == {"demo-order-model"}
    assert JournalEntry.objects.filter(run=run, kind="step", name="order.tool.look_up_product").count() == 1


def test_it_tells_the_model_who_rejected_the_shipment_and_compensates_the_order(stack):  # noqa: F811
    order = an_order(2)
    run = start("order_agent", order, business_key=order["id"], started_by=user("sam"))
    stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_status(run, RunStatus.WAITING)

    reject(run_id=run.id, name="approve:ship_order", user=user("ann"), comment="address is a parcel locker")
    wait_status(run, RunStatus.COMPENSATED)

    # The model's last turn read the rejection and reported the order not shipped, naming who and why;
    # the workflow failed on that report and the charge and the reservation were undone.
    failed = JournalEntry.objects.get(run=run, kind="failed").payload
    assert "was not shipped" in failed["message"] and "rejected by ann" in failed["message"]
    assert "address is a parcel locker" in failed["message"]
    assert executions("shipping", "create").count() == 0 and executions("email", "send").count() == 0
    assert executions("payments", "refund").count() == 1 and executions("inventory", "release").count() == 1
    assert len(gateway_bills(run)) == 5  # look up, capture, reserve, ship, report
    assert run.cost_used > 0

"""Approvals of an agent's tool calls: an irreversible effect tool and a pydantic-ai
approval-required tool both wait in the inbox holding no worker; an approval runs the tool,
a rejection goes back to the model as the tool's result, with who said no and why."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from demo.providers.selectors import executions
from sagas import approvals, approve, reject, start
from sagas.models import ApprovalState, JournalEntry, RunStatus
from tests.agents import wf_agents  # noqa: F401  (registers agent_order here too)
from tests.agents.runs import DISCOUNT, SHIP, billed, cached, prompts, script, tool_returns, wait_status

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bob(transactional_db):
    return get_user_model().objects.create_user("bob", password="pw-bob-long-enough")


def waiting_for(run, name: str):
    """The run WAITING, holding no worker, with one PENDING approval ``name`` in the inbox."""
    run = wait_status(run, RunStatus.WAITING)
    assert run.lease_owner == "" and run.lease_expires_at is None  # no worker is busy with it
    [request] = approvals(run.id)
    assert (request.step, request.state) == (name, ApprovalState.PENDING)
    assert billed() == 1  # only the turn that asked for the tool
    return request


def test_it_ships_once_after_the_irreversible_tool_was_approved(stack, bob):
    run = start("agent_order", {"script": script(SHIP, "Shipped.")})
    stack.worker("w1")
    request = waiting_for(run, "approve:ship_order")
    assert "shipping.create" in request.reason and "cannot be undone" in request.reason
    assert executions("shipping", "create").count() == 0

    approve(user=bob, run_id=run.id, name="approve:ship_order", comment="address checked")
    run = wait_status(run, RunStatus.COMPLETED)
    assert run.result["output"].startswith("Shipped.")
    [shipment] = executions("shipping", "create")
    [shipped] = tool_returns(prompts()[1], "ship_order")  # what the model was told on its next turn
    assert shipped["shipment_id"] == shipment.response["shipment_id"]
    assert (billed(), cached()) == (2, 0)  # the first turn came back from the journal on resume


def test_it_tells_the_model_who_rejected_the_irreversible_tool_and_why(stack, bob):
    run = start("agent_order", {"script": script(SHIP, "Not shipped: the customer will be asked.")})
    stack.worker("w1")
    waiting_for(run, "approve:ship_order")

    reject(user=bob, run_id=run.id, name="approve:ship_order", comment="the address is a PO box")
    run = wait_status(run, RunStatus.COMPLETED)  # the model's next turn ended the run
    assert run.result["output"].startswith("Not shipped: the customer will be asked.")
    assert executions("shipping", "create").count() == 0
    [told] = tool_returns(prompts()[1], "ship_order")
    assert told["status"] == "rejected", told
    assert "bob" in told["message"] and "the address is a PO box" in told["message"], told
    assert (billed(), cached()) == (2, 0)


def test_it_runs_an_approval_required_tool_once_approved(stack, bob):
    run = start("agent_order", {"script": script(DISCOUNT, "Discount given.")})
    stack.worker("w1")
    request = waiting_for(run, "agent.approve.apply_discount")
    assert "apply_discount" in request.reason and '"percent":10' in request.reason.replace(" ", "")
    assert not JournalEntry.objects.filter(run=run, name="agent.tool.apply_discount").exists()

    approve(user=bob, run_id=run.id, name="agent.approve.apply_discount")
    run = wait_status(run, RunStatus.COMPLETED)
    assert run.result["output"].startswith("Discount given.")
    assert JournalEntry.objects.filter(run=run, kind="step", name="agent.tool.apply_discount").count() == 1
    [applied] = tool_returns(prompts()[1], "apply_discount")
    assert applied == {"order": "o-1", "discount_percent": 10, "status": "applied"}
    assert (billed(), cached()) == (2, 0)


def test_it_tells_the_model_an_approval_required_tool_was_rejected_and_why(stack, bob):
    run = start("agent_order", {"script": script(DISCOUNT, "No discount, then.")})
    stack.worker("w1")
    waiting_for(run, "agent.approve.apply_discount")

    reject(user=bob, run_id=run.id, name="agent.approve.apply_discount", comment="no discounts on sale items")
    run = wait_status(run, RunStatus.COMPLETED)
    assert run.result["output"].startswith("No discount, then.")
    assert not JournalEntry.objects.filter(run=run, name="agent.tool.apply_discount").exists()  # never ran
    [told] = tool_returns(prompts()[1], "apply_discount")
    assert "rejected" in told and "bob" in told and "no discounts on sale items" in told, told
    assert (billed(), cached()) == (2, 0)

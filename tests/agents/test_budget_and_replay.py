"""A token budget stops a runaway agent before its next model request; a finished agent run
replays from its journal without a single request to the model gateway; a code change that
alters the agent's tool calls halts the run on replay."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from demo.providers.selectors import executions
from sagas import approve, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.context import Context
from sagas.store.systemdb import ClaimedRun, load_journal
from sagas.versions import registry
from tests.agents import wf_agents
from tests.agents.runs import CAPTURE, CHECK, DISCOUNT, EMAIL, billed, cached, script, wait_status
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# 1,000 input tokens at 3 usd and 500 output tokens at 6 usd per million: 0.006 usd a turn.
PRICES = json.dumps({wf_agents.MODEL_NAME: [3, 6]})


def model_turns(run) -> list[str]:
    return list(JournalEntry.objects.filter(run=run, kind="step", name__startswith="agent.model")
                .order_by("seq").values_list("name", flat=True))


def test_it_stops_a_runaway_agent_at_its_cost_budget_before_another_model_request(stack):
    run = start("agent_order", {"script": script(CHECK)}, max_cost=0.015)  # checks the order forever
    stack.worker("w1", SAGAS_MODEL_PRICES=PRICES)
    run = wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert run.status_reason == "budget_exceeded" and run.error["budget"] == "cost", run.error
    assert run.cost_used == Decimal("0.018")  # three turns: the third crossed the budget...
    assert billed() == 3  # ...and the gateway billed exactly those three, no fourth
    assert model_turns(run) == ["agent.model", "agent.model#2", "agent.model#3"]
    turn = JournalEntry.objects.get(run=run, name="agent.model#3").payload["value"]
    assert (turn["cost"], turn["priced"], turn["usage"]) == (0.006, True, {"input_tokens": 1000, "output_tokens": 500})


def replay_in_this_process(run: WorkflowRun) -> object:
    """Run the workflow again against the finished run's journal, under a fence no write can
    pass (any attempt to act for real would raise LeaseLost): its value."""
    claimed = ClaimedRun(
        id=str(run.id), workflow_name=run.workflow_name, version=run.version, definition_hash=run.definition_hash,
        input=run.input, tenant=run.tenant, business_key=run.business_key, fence=-1, attempts=run.attempts,
        steps_used=run.steps_used, cost_used=run.cost_used, max_steps=None, max_cost=None,
        max_duration_seconds=None, started_at=run.started_at, status=run.status,
    )
    ctx = Context(run=claimed, journal=load_journal(str(run.id)), worker_id="replayer")
    value = registry.find(run.workflow_name, run.version).fn(ctx, run.input)
    ctx.check_finished()  # every recorded call was asked for again, in order
    return value


def test_it_replays_a_finished_agent_run_without_a_model_request(stack, django_user_model):
    bob = django_user_model.objects.create_user("bob", password="pw-bob-long-enough")
    run = start("agent_order", {"script": script(CAPTURE, DISCOUNT, EMAIL, "Done.")})
    first = stack.worker("w1", SAGAS_CRASH_AT="before_complete:agent_order")
    wait_status(run, RunStatus.WAITING)
    approve(user=bob, run_id=run.id, name="agent.approve.apply_discount")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash with the whole conversation journaled")
    assert (billed(), cached()) == (4, 0)

    stack.worker("w2")  # replays every turn and tool call, both approval rounds, then completes
    run = wait_status(run, RunStatus.COMPLETED)
    assert (billed(), cached()) == (4, 0)  # not one request reached the gateway
    assert executions("payments", "capture").count() == 1 and executions("email", "send").count() == 1

    # The conversation is in the journal: each turn holds what was new since the previous one.
    turns = [JournalEntry.objects.get(run=run, name=name).payload["value"] for name in model_turns(run)]
    assert [t["key"] for t in turns] == [f"{run.id}:agent:turn-{n}" for n in (1, 2, 3, 4)]
    assert [[(p["part_kind"], p.get("tool_name")) for m in t["request"] for p in m["parts"]] for t in turns] == [
        [("user-prompt", None)], [("tool-return", "capture_payment")], [("tool-return", "apply_discount")],
        [("tool-return", "send_email")],
    ]
    assert turns[0]["request"][0]["instructions"] == "You handle orders."
    assert [p["tool_name"] for t in turns[:3] for p in t["response"]["parts"]] == [
        "capture_payment", "apply_discount", "send_email"]

    assert replay_in_this_process(run) == run.result  # and once more, here, after it finished
    assert (billed(), cached()) == (4, 0)
    assert WorkflowRun.objects.get(id=run.id).last_seq == run.last_seq  # the replay wrote nothing


@pytest.mark.parametrize("change, asked", [
    ({"AGENT_PLAIN_TOOLS": "capture_payment"}, "agent.tool.capture_payment"),  # an effect became a plain tool
    ({"AGENT_DROP_TOOLS": "capture_payment"}, "agent.model#2"),  # gone: the model is told, and asked again
])
def test_it_halts_a_replay_whose_code_changed_the_tool_calls(stack, change, asked):
    run = start("agent_order", {"script": script(CAPTURE, EMAIL, "Done.")})
    first = stack.worker("w1", SAGAS_CRASH_AT="before_step:agent.model#2")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash after the capture was recorded")
    stack.worker("w2", **change)
    run = wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert run.status_reason == "non_determinism", run.error
    assert run.error["journal"]["name"] == "capture_payment", run.error
    assert run.error["code_asked"]["name"] == asked, run.error
    assert executions("payments", "capture").count() == 1  # nothing ran twice...
    assert executions("email", "send").count() == 0  # ...nor went on past the mismatch
    assert (billed(), cached()) == (1, 0)


def test_a_tenants_daily_spend_limit_on_the_model_parks_an_agent_before_its_next_request(stack):
    """The agent's model turns count toward its tenant's day on ``"model"``: the turn that finds
    the day spent is not sent (the gateway bills nothing more), and the run waits for a person
    to raise the limit; then it goes on from that turn, billing none of the earlier ones again."""
    from ledger import set_spend_limit

    set_spend_limit(tenant="acme", connector="model", per_day="0.012", by="ops")  # two turns of 0.006
    run = start("agent_order", {"script": script(CHECK)}, tenant="acme", max_cost=0.024)  # checks forever
    stack.worker("w1", SAGAS_MODEL_PRICES=PRICES)
    run = wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert run.status_reason == "spend_limit", (run.status_reason, run.error)
    assert run.error["connector"] == "model" and run.error["tenant"] == "acme"
    assert billed() == 2 and model_turns(run) == ["agent.model", "agent.model#2"]

    set_spend_limit(tenant="acme", connector="model", per_day="0.018", by="ops")  # one more turn
    wait_until(lambda: billed() == 3, timeout=60, what="the sweeper resuming the run under the raised limit")
    run = wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert run.status_reason == "spend_limit", (run.status_reason, run.error)
    assert billed() == 3 and model_turns(run) == ["agent.model", "agent.model#2", "agent.model#3"]
    assert run.cost_used == Decimal("0.018")

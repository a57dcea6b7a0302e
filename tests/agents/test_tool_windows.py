"""A crash in each window of an agent's tool call, and during a model request, with real
workers, the real providers and model gateway, and real SIGKILLs. The providers' own books
count what really executed; the gateway's count what was billed."""

from __future__ import annotations

import json
import signal
from decimal import Decimal

import pytest

from demo.models import ProviderFault
from demo.providers.faults import inject
from demo.providers.selectors import executions, replays
from ledger.models import EffectRecord, EffectStatus
from ledger.services import effect_resolve
from sagas import effects, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.agents import wf_agents
from tests.agents.runs import CAPTURE, EMAIL, billed, cached, prompts, script, tool_returns, wait_status
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = script(CAPTURE, EMAIL, "Order o-1 is paid and confirmed.")
# 1,000 input tokens at 3 usd and 500 output tokens at 6 usd per million: 0.006 usd a turn.
PRICES = json.dumps({wf_agents.MODEL_NAME: [3, 6]})


def capture_record(run) -> EffectRecord:
    return EffectRecord.objects.get(run_id=run.id, step_name="capture_payment")


def assert_finished_once(run) -> None:
    """Completed, each tool executed once at its provider, each of the 3 turns billed once."""
    run = wait_status(run, RunStatus.COMPLETED)
    assert run.result["output"].startswith("Order o-1 is paid and confirmed.")
    assert executions("payments", "capture").count() == 1
    assert executions("email", "send").count() == 1
    assert billed() == 3
    assert [e.status for e in effects(run.id)] == [EffectStatus.SUCCEEDED, EffectStatus.SUCCEEDED]


def test_it_captures_once_after_a_crash_before_the_tool_call_was_dispatched(stack):
    run = start("agent_order", {"script": ORDER})
    first = stack.worker("w1", SAGAS_CRASH_AT="after_intent:capture_payment")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash between the intent and the dispatch")
    assert executions("payments", "capture").count() == 0
    assert billed() == 1  # the turn that asked for the capture, already journaled
    stack.worker("w2")
    assert_finished_once(run)
    assert cached() == 0  # turn 1 came back from the journal: the gateway was not asked again


def test_it_finds_the_capture_by_lookup_after_the_provider_killed_its_caller(stack):
    run = start("agent_order", {"script": ORDER})
    inject("payments", "capture", "kill_caller_after_work")
    first = stack.worker("w1")
    wait_until(lambda: not first.alive(), 20, what="the payments provider to SIGKILL w1 after capturing")
    assert first.popen.returncode == -9
    assert capture_record(run).status == EffectStatus.IN_PROGRESS  # w1 died holding it
    stack.worker("w2")
    assert_finished_once(run)
    assert capture_record(run).resolution == "lookup"
    assert cached() == 0


def test_it_captures_once_after_a_crash_between_the_answer_and_its_record(stack):
    run = start("agent_order", {"script": ORDER})
    first = stack.worker("w1", SAGAS_CRASH_AT="after_outcome:capture_payment")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash before recording the capture's outcome")
    assert executions("payments", "capture").count() == 1
    assert capture_record(run).status == EffectStatus.IN_PROGRESS  # the outcome's commit never happened
    stack.worker("w2")
    assert_finished_once(run)
    assert cached() == 0


def test_it_does_not_call_a_recorded_tool_again_after_a_crash_after_its_record(stack):
    run = start("agent_order", {"script": ORDER})
    first = stack.worker("w1", SAGAS_CRASH_AT="before_step:agent.model#2")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash before the second model request")
    assert capture_record(run).status == EffectStatus.SUCCEEDED
    assert JournalEntry.objects.filter(run=run, kind="effect_result", name="capture_payment").exists()
    stack.worker("w2")
    assert_finished_once(run)
    assert capture_record(run).resolution == ""  # replayed from the journal: no lookup, no call
    assert cached() == 0


def test_it_leaves_an_email_unknown_and_unsent_again_until_a_person_resolves_it(stack):
    run = start("agent_order", {"script": script(EMAIL, "Sent.")})
    inject("email", "send", "kill_caller_after_work")
    first = stack.worker("w1")
    wait_until(lambda: not first.alive(), 20, what="the email provider to SIGKILL w1 after sending")
    stack.worker("w2")
    run = wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert run.status_reason == "effect_unknown"
    assert executions("email", "send").count() == 1  # sent once, and not sent again on a guess
    [record] = effects(run.id)
    assert record.status == EffectStatus.UNKNOWN and record.step_name == "send_email"
    assert billed() == 1  # the model was not asked what to do with an outcome nobody knows

    effect_resolve(effect_id=record.id, outcome="succeeded", note="seen in the mail log", user=None,
                   actor="alice", downstream_ref="msg-from-log")
    run = wait_status(run, RunStatus.COMPLETED)  # the agent goes on with the person's evidence
    assert executions("email", "send").count() == 1  # resolving did not send again
    [told] = tool_returns(prompts()[1], "send_email")
    assert told == {"message_id": "msg-from-log", "resolved_manually": True}


def test_it_repeats_only_the_model_request_that_a_crash_cut_and_the_gateway_bills_it_once(stack):
    run = start("agent_order", {"script": ORDER})
    inject("model", "complete", "latency:0")  # turn 1 answers normally...
    inject("model", "complete", "kill_caller_after_work")  # ...turn 2 is billed, then w1 dies
    first = stack.worker("w1", SAGAS_MODEL_PRICES=PRICES)
    wait_until(lambda: not first.alive(), 20, what="the gateway to SIGKILL w1 during the second turn")
    assert first.popen.returncode == -9
    assert billed() == 2
    stack.worker("w2", SAGAS_MODEL_PRICES=PRICES)
    assert_finished_once(run)
    assert WorkflowRun.objects.get(id=run.id).cost_used == Decimal("0.018")  # three turns, each charged once
    [replay] = replays("model", "complete")  # w2 repeated turn 2 only, under the same key
    assert replay.execution.idempotency_key == f"{run.id}:agent:turn-2"
    assert replay.caller_pid != first.pid
    keys = list(executions("model", "complete").values_list("idempotency_key", flat=True))
    assert keys == [f"{run.id}:agent:turn-{n}" for n in (1, 2, 3)]


def test_it_hands_an_agent_run_back_when_its_worker_is_told_to_stop_during_a_model_request(stack):
    run = start("agent_order", {"script": ORDER})
    inject("model", "complete", "latency:0")  # turn 1 answers at once...
    inject("model", "complete", "latency:1.5")  # ...turn 2 takes a while
    first = stack.worker("w1")
    wait_until(lambda: ProviderFault.objects.filter(fault="latency:1.5", remaining=0).exists(), 20,
               what="the second turn to reach the gateway")
    first.signal(signal.SIGTERM)
    wait_until(lambda: not first.alive(), 20, what="w1 to stop after the request in flight")
    assert first.popen.returncode == 0, first.log()
    assert JournalEntry.objects.filter(run=run, kind="yielded").exists()  # handed back, not left to its lease
    assert billed() == 2 and executions("payments", "capture").count() == 1
    stack.worker("w2")
    assert_finished_once(run)
    assert cached() == 0  # the answer w1 waited for was journaled: w2 did not ask again


def test_it_tells_the_model_a_capture_was_refused_and_lets_it_go_on(stack):
    run = start("agent_order", {"script": script(CAPTURE, "The card was declined; nothing was charged.")})
    inject("payments", "capture", "final")
    stack.worker("w1")
    run = wait_status(run, RunStatus.COMPLETED)
    assert run.result["output"].startswith("The card was declined")
    assert executions("payments", "capture").count() == 0
    [record] = effects(run.id)
    assert record.status == EffectStatus.FAILED_FINAL and record.attempts == 1  # refused, never retried
    [told] = tool_returns(prompts()[1], "capture_payment")
    assert told["status"] == "failed" and "Final" in told["message"], told

"""``sagas.testing``: crashes at named points, recovery "as another worker" and a controllable
clock, all in this process, against the real engine, journal and ledger on PostgreSQL.

The connectors and step functions here count their real executions in lists, so every test
asserts how many times something really happened, not only what the run says.
"""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from ledger.connectors import Connector, connector
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import NotExecuted, Succeeded
from sagas import start, testing
from sagas.models import ApprovalRequest, ApprovalState, JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome
from sagas.runtime import crashpoints
from sagas.testing import (
    CrashPointNotReached,
    RunLeased,
    SimulatedCrash,
    advance_clock,
    crash_at,
    expire_lease,
    frozen_clock,
    run_until_idle,
    sweep_once,
)
from sagas.versions.registry import workflow
from tests.sagas import wf_continue, wf_engine  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]

calls: list[str] = []  # every real execution of a step function or a connector, in order
provider: dict[str, dict] = {}  # what the "provider" of the lookup connector has done, by key


@pytest.fixture(autouse=True)
def fresh_calls():
    calls.clear()
    provider.clear()


def counted(label: str) -> str:
    calls.append(label)
    return f"{label}-done"


@connector("testing_tests.blind")
class Blind(Connector):
    """Neither idempotent nor able to look an operation up: after an unknown outcome, a person decides."""

    def execute(self, payload, *, key):
        calls.append(f"blind:{key}")
        return {"id": f"ch-{len(calls)}"}


@connector("testing_tests.lookup")
class WithLookup(Connector):
    """Can ask the provider whether a key was executed."""

    def execute(self, payload, *, key):
        calls.append(f"lookup:{key}")
        provider[key] = {"id": f"ch-{len(calls)}"}
        return provider[key]

    def lookup(self, key):
        return Succeeded(result=provider[key], downstream_ref=provider[key]["id"]) if key in provider else NotExecuted()


@workflow("testing_steps", version=1)
def wf_steps(ctx, spec):
    return [ctx.step("a", counted, "a"), ctx.step("b", counted, "b")]


@workflow("testing_charge", version=1)
def wf_charge(ctx, spec):
    charged = ctx.effect("charge", spec["connector"], {"amount_cents": 500})
    return {"charged": charged["id"], "after": ctx.step("after", counted, "after")}


@workflow("testing_timer", version=1)
def wf_timer(ctx, spec):
    ctx.sleep(timedelta(hours=1))
    return ctx.step("woke", counted, "woke")


@workflow("testing_approval", version=1)
def wf_approval(ctx, spec):
    ctx.approval("ship", reason="ship it?", timeout=timedelta(hours=24), on_timeout="reject")
    return "shipped"


def journal(run) -> list[tuple[str, str]]:
    return list(JournalEntry.objects.filter(run_id=run.id).order_by("seq").values_list("kind", "name"))


# --- crash points -----------------------------------------------------------------------


def test_a_step_whose_result_was_not_journaled_runs_again_and_a_journaled_one_does_not():
    run = start("testing_steps", {})
    with crash_at("after_step", "a") as crash:  # "a" ran; the worker dies before journaling it
        run_until_idle(run.id)
    assert crash.happened and calls == ["a"]
    crashed = WorkflowRun.objects.get(id=run.id)
    assert crashed.status == RunStatus.RUNNING and crashed.lease_owner  # as a dead worker leaves it
    assert ("step", "a") not in journal(run)
    with pytest.raises(RunLeased):  # its lease still holds: nobody else may take it yet
        run_until_idle(run.id)

    expire_lease(run.id)
    with crash_at("after_step_record:b"):  # "b" ran and was journaled, then the next worker dies too
        run_until_idle(run.id)
    assert calls == ["a", "a", "b"]  # at-least-once for a step whose result was lost
    expire_lease(run.id)
    done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.result == ["a-done", "b-done"]
    assert calls == ["a", "a", "b"]  # a journaled step never runs again
    owners = JournalEntry.objects.filter(run_id=run.id, kind="claimed").values_list("worker_id", flat=True)
    assert len(set(owners)) == 3  # three workers, one after another


def test_a_crash_after_the_provider_answered_is_never_charged_twice_without_a_lookup_it_is_unknown():
    run = start("testing_charge", {"connector": "testing_tests.blind"})
    with crash_at("after_dispatch", "charge"):  # the connector returned; its outcome is not recorded
        run_until_idle(run.id)
    assert len(calls) == 1
    assert EffectRecord.objects.get(run_id=run.id).status == EffectStatus.IN_PROGRESS

    expire_lease(run.id)
    parked = run_until_idle(run.id)
    assert len(calls) == 1  # not executed again: nobody can know whether it happened
    assert parked.status == RunStatus.NEEDS_ATTENTION and parked.status_reason == "effect_unknown"
    assert EffectRecord.objects.get(run_id=run.id).status == EffectStatus.UNKNOWN


def test_a_crash_after_the_provider_answered_is_settled_by_a_lookup():
    run = start("testing_charge", {"connector": "testing_tests.lookup"})
    with crash_at("after_dispatch", "charge"):
        run_until_idle(run.id)
    expire_lease(run.id)
    done = run_until_idle(run.id)
    assert [c for c in calls if c.startswith("lookup:")] == [f"lookup:{EffectRecord.objects.get(run_id=run.id).idempotency_key}"]
    assert done.status == RunStatus.COMPLETED and done.result["charged"] == "ch-1"
    effect = EffectRecord.objects.get(run_id=run.id)
    assert (effect.status, effect.resolution) == (EffectStatus.SUCCEEDED, "lookup")


def test_a_crash_inside_the_outcomes_transaction_leaves_nothing_of_it():
    run = start("testing_charge", {"connector": "testing_tests.lookup"})
    with crash_at("after_outcome", "charge"):  # SUCCEEDED and effect_result written, not committed
        run_until_idle(run.id)
    assert EffectRecord.objects.get(run_id=run.id).status == EffectStatus.IN_PROGRESS  # rolled back
    assert "effect_result" not in [kind for kind, _ in journal(run)]
    expire_lease(run.id)
    assert run_until_idle(run.id).status == RunStatus.COMPLETED
    assert len([c for c in calls if c.startswith("lookup:")]) == 1


def test_a_crash_before_the_intent_leaves_no_trace_and_the_effect_runs_once():
    run = start("testing_charge", {"connector": "testing_tests.blind"})
    with crash_at("before_intent", "charge"):
        run_until_idle(run.id)
    assert calls == [] and not EffectRecord.objects.filter(run_id=run.id).exists()
    expire_lease(run.id)
    assert run_until_idle(run.id).status == RunStatus.COMPLETED
    assert len([c for c in calls if c.startswith("blind:")]) == 1


def test_the_crash_cannot_be_swallowed_by_workflow_code():
    assert issubclass(SimulatedCrash, BaseException) and not issubclass(SimulatedCrash, Exception)


def test_it_refuses_an_unknown_point_and_says_when_the_point_was_never_reached():
    with pytest.raises(ValueError, match="unknown crash point 'after_stpe'.*after_step"):
        with crash_at("after_stpe"):
            pass
    run = start("testing_steps", {})
    with pytest.raises(CrashPointNotReached, match="never reached after_step:nope"):
        with crash_at("after_step", "nope"):
            run_until_idle(run.id)
    assert run_until_idle(run.id).status == RunStatus.COMPLETED  # it ran to the end: nothing crashed
    assert crashpoints.in_process_hook is None  # disarmed on the way out


def _crash_point_calls() -> set[str]:
    """The first argument of every crash_point(...) call in the engine and the ledger."""
    found = set()
    for path in [*(ROOT / "sagas").rglob("*.py"), *(ROOT / "ledger").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "crash_point"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
    return found


def test_it_knows_every_crash_point_the_engine_has():
    assert _crash_point_calls() == crashpoints.POINTS


# --- time -------------------------------------------------------------------------------


def test_a_timer_fires_when_the_clock_is_moved_past_it_not_before():
    run = start("testing_timer", {})
    with frozen_clock() as clock:
        waiting = run_until_idle(run.id)
        assert waiting.status == RunStatus.WAITING and waiting.wake_at == clock.now() + timedelta(hours=1)
        advance_clock(timedelta(minutes=59))
        assert sweep_once().woken == 0
        assert WorkflowRun.objects.get(id=run.id).status == RunStatus.WAITING
        advance_clock(timedelta(minutes=1))
        assert sweep_once().woken == 1
        done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and calls == ["woke"]
    assert ("timer_fired", "") in journal(run)
    assert abs(timezone.now() - clock.now()) > timedelta(minutes=59)  # the real clock is back


def test_an_approval_deadline_passes_when_the_clock_is_moved():
    run = start("testing_approval", {})
    with frozen_clock():
        assert run_until_idle(run.id).status == RunStatus.WAITING
        advance_clock(timedelta(hours=24))
        assert sweep_once().woken == 1
        failed = run_until_idle(run.id)
    assert failed.status == RunStatus.FAILED and failed.status_reason == "approval_rejected"
    assert ApprovalRequest.objects.get(run_id=run.id).state == ApprovalState.EXPIRED


def test_an_expired_lease_is_what_the_real_sweeper_finds():
    run = start("testing_steps", {})
    with crash_at("before_step", "b"):
        run_until_idle(run.id)
    assert sweep_once().expired == 0  # the dead worker's lease still holds
    expire_lease(run.id)
    assert sweep_once().expired == 1
    assert run_until_idle(run.id).status == RunStatus.COMPLETED
    assert calls == ["a", "b"]


def test_the_clock_moves_only_forward_and_only_inside_its_block():
    with pytest.raises(RuntimeError, match="needs a frozen_clock"):
        advance_clock(timedelta(seconds=1))
    with frozen_clock() as clock, pytest.raises(ValueError):
        clock.advance(-timedelta(seconds=1))
    assert testing.Clock is type(clock)


# --- in-process twins of tests that start a worker process only to end it at a crash point ---


def _chain(first_id) -> list[WorkflowRun]:
    runs, next_id = [], first_id
    while next_id is not None:
        runs.append(WorkflowRun.objects.get(id=next_id))
        next_id = runs[-1].continued_to
    return runs


def test_a_step_run_but_not_recorded_runs_again_and_nothing_else(step_calls):
    """Twin of tests/sagas/test_recovery.py::test_it_runs_an_executed_but_unrecorded_step_again_and_nothing_else."""
    run = start("five_steps", {})
    with crash_at("after_step:s2"):  # s2 ran; its result is not journaled
        run_until_idle(run.id)
    expire_lease(run.id)
    assert run_until_idle(run.id).status == RunStatus.COMPLETED
    assert step_calls.counts(run.id) == {"s1": 1, "s2": 2, "s3": 1, "s4": 1, "s5": 1}


def test_recorded_now_random_and_uuid_are_replayed_after_a_crash(step_calls):
    """Twin of tests/sagas/test_recovery.py::test_it_returns_recorded_now_random_and_uuid_on_replay."""
    run = start("recorded_values", {})
    with crash_at("after_step_record:remember"):
        run_until_idle(run.id)
    expire_lease(run.id)
    done = run_until_idle(run.id)
    [(_, first_values, _)] = step_calls.rows(run.id, "remember")
    assert done.result == first_values  # the second worker replayed the first one's values
    assert step_calls.counts(run.id) == {"remember": 1, "after": 1}
    assert done.attempts == 2


def test_a_crash_inside_the_continuation_leaves_exactly_one_successor_after_replay(step_calls):
    """Twin of the test of that name in tests/sagas/test_continue_as_new.py."""
    first = start("cont_loop", {"label": "C", "end": 6, "every": 3})
    with crash_at("continue_as_new_uncommitted"):
        run_until_idle(first.id)
    first.refresh_from_db()  # the old run was marked finished in the transaction that died
    assert (first.status, first.continued_to) == (RunStatus.RUNNING, None)
    assert not WorkflowRun.objects.filter(continued_from=first.id).exists()

    expire_lease(first.id)
    assert run_until_idle(first.id).continued_to is not None  # replayed, continued
    runs = _chain(first.id)
    assert len(runs) == 2 and run_until_idle(runs[1].id).status == RunStatus.COMPLETED
    runs = _chain(first.id)
    assert runs[0].status_reason == "continued_as_new" and runs[1].continued_from == first.id
    assert runs[0].attempts == 2  # replayed once
    assert step_calls.counts("C") == {f"turn{i}": 1 for i in range(6)}  # the replay ran no turn again
    assert WorkflowRun.objects.count() == 2


def test_a_crash_after_the_continuation_commits_never_continues_twice(step_calls):
    """Twin of the test of that name in tests/sagas/test_continue_as_new.py."""
    first = start("cont_loop", {"label": "D", "end": 6, "every": 3})
    with crash_at("after_continue_as_new"):
        run_until_idle(first.id)
    [successor] = WorkflowRun.objects.filter(continued_from=first.id)
    assert successor.status == RunStatus.PENDING  # created, but its wake-up never sent
    assert run_until_idle(first.id).outcome == Outcome.NOT_CLAIMED  # finished for good
    assert run_until_idle(successor.id).status == RunStatus.COMPLETED
    runs = _chain(first.id)
    assert [r.id for r in runs] == [first.id, successor.id] and runs[0].attempts == 1
    assert step_calls.counts("D") == {f"turn{i}": 1 for i in range(6)}
    assert WorkflowRun.objects.count() == 2

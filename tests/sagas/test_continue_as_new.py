"""Continue-as-new: a long loop hands itself to a fresh run, linked both ways, budgets carried,
with real worker processes, real crashes, real PostgreSQL and Redis."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome, advance
from tests.procs import wait_until
from tests.sagas import wf_continue  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_continue"


def chain_of(first_id) -> list[WorkflowRun]:
    """The runs of a chain, first to newest, following ``continued_to``."""
    runs, next_id = [], first_id
    while next_id is not None:
        run = WorkflowRun.objects.get(id=next_id)
        runs.append(run)
        next_id = run.continued_to
    return runs


def chain_done(first_id) -> bool:
    runs = chain_of(first_id)
    return runs[-1].status == RunStatus.COMPLETED and runs[-1].status_reason == ""


def assert_linked(runs: list[WorkflowRun]) -> None:
    """Each run points at the next and back; each has at most one successor."""
    for n, (old, new) in enumerate(zip(runs, runs[1:]), start=2):
        assert old.continued_to == new.id and new.continued_from == old.id
        assert (old.status, old.status_reason) == (RunStatus.COMPLETED, "continued_as_new")
        assert old.result == {"continued_as": str(new.id)}
        assert new.started_via == "continue_as_new" and new.tenant == old.tenant
        assert WorkflowRun.objects.filter(continued_from=old.id).count() == 1
        chain = JournalEntry.objects.get(run=new, seq=1).payload["chain"]
        assert chain == {"first": str(runs[0].id), "position": n, "business_key": runs[0].business_key}
    assert runs[0].continued_from is None and runs[-1].continued_to is None


def test_it_continues_a_long_loop_in_linked_runs_each_with_a_short_journal(procs, step_calls):
    first = start("cont_loop", {"label": "L", "end": 25, "every": 10}, business_key="loop-1", tenant="acme")
    procs.worker("w1", MODULES)
    wait_until(lambda: chain_done(first.id), 30, what="the chain to finish")

    runs = chain_of(first.id)
    assert len(runs) == 3
    assert_linked(runs)
    assert runs[-1].result == {"turns": 25, "run": str(runs[-1].id)}
    assert [r.business_key for r in runs] == ["loop-1", "loop-1#2", "loop-1#3"]
    assert [r.input["i"] if "i" in r.input else 0 for r in runs] == [0, 10, 20]
    # Each run journals only its own turns: 10, 10, 5, not the whole history.
    assert [JournalEntry.objects.filter(run=r, kind="step").count() for r in runs] == [10, 10, 5]
    last = JournalEntry.objects.filter(run=runs[0]).order_by("-seq").first()
    assert last.kind == "continued_as_new" and last.payload["continued_as"] == str(runs[1].id)
    assert step_calls.counts("L") == {f"turn{i}": 1 for i in range(25)}
    # start() with the chain's business key still finds the chain's first run.
    assert start("cont_loop", {"label": "L", "end": 25, "every": 10}, business_key="loop-1", tenant="acme").id \
        == first.id


def test_it_carries_the_chains_budgets_into_each_new_run(procs, step_calls):
    first = start("cont_loop", {"label": "B", "end": 100, "every": 10, "cost": 0.01}, max_steps=25, max_cost=50)
    procs.worker("w1", MODULES)
    wait_until(lambda: chain_of(first.id)[-1].status == RunStatus.NEEDS_ATTENTION, 30,
               what="the chain to use up its step budget")

    runs = chain_of(first.id)
    assert len(runs) == 3
    assert_linked(runs)
    last = runs[-1]
    # 25 steps in all, not 25 per run: the third run stopped after its 5th turn.
    assert (last.status_reason, last.error["budget"], last.error["used"]) == ("budget_exceeded", "steps", 25)
    assert [r.steps_used for r in runs] == [10, 20, 25]
    assert [r.cost_used for r in runs] == [Decimal("0.1"), Decimal("0.2"), Decimal("0.25")]
    assert all(r.max_steps == 25 and r.max_cost == Decimal(50) for r in runs)
    # The duration budget counts from the chain's first start.
    assert {r.started_at for r in runs} == {runs[0].started_at}
    assert len(step_calls.counts("B")) == 25


def test_it_refuses_a_state_that_is_not_json_with_a_clear_error(step_calls):
    run = start("cont_bad_state", {})
    assert advance(str(run.id), owner="t") == Outcome.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.continued_to is None
    assert run.error["type"] == "NotSerializable"
    assert "the state given to ctx.continue_as_new" in run.error["message"], run.error
    assert not WorkflowRun.objects.filter(continued_from=run.id).exists()


def test_a_crash_inside_the_continuation_leaves_exactly_one_successor_after_replay(procs, step_calls):
    first = start("cont_loop", {"label": "C", "end": 6, "every": 3})
    crashed = procs.worker("w1", MODULES, SAGAS_CRASH_AT="continue_as_new_uncommitted")
    wait_until(lambda: not crashed.alive(), 30, what="w1 to crash inside the continuation")
    assert crashed.popen.returncode == 97
    # The old run was marked finished in the transaction that died with w1: nothing of it stayed.
    first.refresh_from_db()
    assert (first.status, first.continued_to) == (RunStatus.RUNNING, None)
    assert not WorkflowRun.objects.filter(continued_from=first.id).exists()

    procs.worker("w2", MODULES)  # claims the run once w1's lease runs out, replays, continues
    wait_until(lambda: chain_done(first.id), 30, what="the chain to finish on w2")
    runs = chain_of(first.id)
    assert len(runs) == 2
    assert_linked(runs)
    assert runs[0].attempts == 2  # replayed once
    assert step_calls.counts("C") == {f"turn{i}": 1 for i in range(6)}  # the replay ran no turn again
    assert WorkflowRun.objects.count() == 2


def test_a_crash_after_the_continuation_commits_never_continues_twice(procs, step_calls):
    first = start("cont_loop", {"label": "D", "end": 6, "every": 3})
    crashed = procs.worker("w1", MODULES, SAGAS_CRASH_AT="after_continue_as_new")
    wait_until(lambda: not crashed.alive(), 30, what="w1 to crash after the continuation committed")
    assert crashed.popen.returncode == 97
    [successor] = WorkflowRun.objects.filter(continued_from=first.id)
    assert successor.status == RunStatus.PENDING  # created, but its wake-up never sent

    procs.worker("w2", MODULES)  # its sweeper finds the successor no queue holds
    wait_until(lambda: chain_done(first.id), 30, what="the chain to finish on w2")
    runs = chain_of(first.id)
    assert len(runs) == 2 and runs[1].id == successor.id
    assert_linked(runs)
    assert runs[0].attempts == 1  # finished for good: never claimed or replayed again
    assert step_calls.counts("D") == {f"turn{i}": 1 for i in range(6)}
    assert WorkflowRun.objects.count() == 2


def test_sigkills_during_a_fast_chain_leave_one_linear_chain_and_repeat_at_most_the_turn_in_flight(procs, step_calls):
    """Real SIGKILLs wherever the worker happens to be (a turn, a continuation, a claim): the chain
    stays one line, each run has at most one successor, and no turn runs more than twice."""
    first = start("cont_loop", {"label": "K", "end": 40, "every": 2, "pause": 0.02})
    for n in range(3):
        worker = procs.worker(f"k{n}", MODULES)
        wait_until(lambda n=n: len(step_calls.counts("K")) >= 8 * (n + 1), 60, what=f"turns before kill {n}")
        worker.kill()
    procs.worker("last", MODULES)
    wait_until(lambda: chain_done(first.id), 90, what="the chain to finish after the kills")

    runs = chain_of(first.id)
    assert len(runs) == 20  # 40 turns, 2 per run
    assert_linked(runs)
    assert WorkflowRun.objects.count() == 20  # no orphan successor anywhere
    counts = step_calls.counts("K")
    assert set(counts) == {f"turn{i}" for i in range(40)} and max(counts.values()) <= 2, counts


def test_a_successor_whose_chain_key_is_taken_continues_without_a_key(step_calls):
    squatter = start("cont_loop", {"label": "S", "end": 1, "every": 1}, business_key="dup#2")
    first = start("cont_loop", {"label": "F", "end": 2, "every": 1}, business_key="dup")
    assert advance(str(first.id), owner="t") == Outcome.COMPLETED
    first.refresh_from_db()
    successor = WorkflowRun.objects.get(id=first.continued_to)
    assert successor.business_key == "" and successor.continued_from == first.id
    assert WorkflowRun.objects.get(business_key="dup#2").id == squatter.id  # untouched
    assert advance(str(successor.id), owner="t") == Outcome.COMPLETED


def test_a_signal_sent_to_a_run_that_continued_reaches_the_run_that_continues_it():
    from sagas import signal
    from sagas.errors import RunFinished

    first = start("cont_signal", {}, business_key="sig-loop")
    assert advance(str(first.id), owner="t") == Outcome.COMPLETED  # continued as new
    first.refresh_from_db()
    second = WorkflowRun.objects.get(id=first.continued_to)
    advance(str(second.id), owner="t")
    second.refresh_from_db()
    assert second.status == RunStatus.WAITING

    # The sender knows the loop by its first run only.
    assert signal(run_id=first.id, name="go", payload={"n": 7}) == str(second.id)
    assert not JournalEntry.objects.filter(run=first, kind="signal_received").exists()
    assert advance(str(second.id), owner="t") == Outcome.COMPLETED
    second.refresh_from_db()
    assert second.result == {"got": {"n": 7}}
    with pytest.raises(RunFinished):  # the chain ended: nobody is left to take it
        signal(run_id=first.id, name="go", payload={})

"""Pause and resume with a real worker process: an operator pauses a run while its step runs.
The step finishes and is recorded, the worker hands the run back before the next step, no
worker takes it while it is paused (a second one is running), and it completes once resumed,
every step run exactly once."""

from __future__ import annotations

import pytest

from sagas import pause, resume, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome
from sagas.replay.engine import advance as engine_advance
from sagas.testing import sweep_once
from tests.procs import wait_until
from tests.sagas import wf_engine  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"


def test_it_pauses_a_run_during_a_step_and_resumes_it_where_it_stopped(procs, step_calls):
    run = start("five_steps", {"slow_step3": 1.5})
    procs.worker("w1", MODULES)
    procs.worker("w2", MODULES)
    wait_until(lambda: step_calls.counts(run.id).get("s3"), 30, what="step 3 to start")
    pause(run_id=run.id, reason="the tax rounding looks wrong")  # during s3

    wait_until(lambda: JournalEntry.objects.filter(run=run, kind="yielded").exists(), 30,
               what="the worker to hand the paused run back")
    held = WorkflowRun.objects.get(id=run.id)
    assert held.status == RunStatus.PENDING and held.lease_owner == "" and held.paused_at is not None
    steps = list(JournalEntry.objects.filter(run=run, kind="step").values_list("name", flat=True))
    assert steps == ["s1", "s2", "s3"]  # the step in flight was recorded; s4 never started
    assert step_calls.counts(run.id) == {"s1": 1, "s2": 1, "s3": 1}
    yielded = JournalEntry.objects.get(run=run, kind="yielded")
    assert yielded.payload == {"reason": "paused by an operator"}

    # Held: the sweeper does not queue it, a worker asked to take it cannot, two live workers leave it.
    assert sweep_once().total == 0
    assert engine_advance(str(run.id), owner="test") == Outcome.NOT_CLAIMED
    assert WorkflowRun.objects.get(id=run.id).status == RunStatus.PENDING

    resume(run_id=run.id, reason="rounding confirmed")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 60,
               what="the resumed run to complete")
    assert step_calls.counts(run.id) == {f"s{i}": 1 for i in range(1, 6)}  # nothing ran twice
    kinds = [(k, n) for k, n in JournalEntry.objects.filter(run=run, kind="operator_action")
             .order_by("seq").values_list("kind", "name")]
    assert kinds == [("operator_action", "pause"), ("operator_action", "resume")]

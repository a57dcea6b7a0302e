"""Pause and resume (``sagas.pause`` / ``resume``, ``pause_workflow`` / ``resume_workflow``),
in this process against the real engine and journal on PostgreSQL (``sagas.testing``). The
step functions count their real executions, so each test says how often a step really ran.
The same with a real worker process, paused during a step: ``tests/sagas/test_pause_worker.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from sagas import (
    ActionNotAllowed,
    InvalidArgument,
    RunFinished,
    pause,
    pause_workflow,
    resume,
    resume_workflow,
    start,
)
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome
from sagas.replay.engine import advance as engine_advance
from sagas.testing import advance_clock, frozen_clock, run_until_idle, sweep_once
from sagas.versions.registry import workflow

pytestmark = pytest.mark.django_db(transaction=True)

calls: list[str] = []


@pytest.fixture(autouse=True)
def fresh_calls():
    calls.clear()


def counted(label: str) -> str:
    calls.append(label)
    return f"{label}-done"


def pause_me(run_id: str) -> str:
    """A step during which an operator pauses its own run (what the console's button does)."""
    calls.append("a")
    pause(run_id=run_id, reason="checking the tax rounding")
    return "a-done"


@workflow("pause_steps", version=1)
def wf_steps(ctx, spec):
    first = ctx.step("a", pause_me, spec["run_id"]) if spec.get("pause_in_a") else ctx.step("a", counted, "a")
    return [first, ctx.step("b", counted, "b"), ctx.step("c", counted, "c")]


@workflow("pause_timer", version=1)
def wf_timer(ctx, spec):
    ctx.sleep(timedelta(hours=1))
    return ctx.step("woke", counted, "woke")


def journal(run) -> list[tuple[str, str]]:
    return list(JournalEntry.objects.filter(run_id=run.id).order_by("seq").values_list("kind", "name"))


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def test_a_run_paused_during_a_step_records_that_step_and_stops_before_the_next():
    run = start("pause_steps", {"pause_in_a": True}, business_key="p-1")
    WorkflowRun.objects.filter(id=run.id).update(input={"pause_in_a": True, "run_id": str(run.id)})

    assert engine_advance(str(run.id), owner="w1") == Outcome.YIELDED
    assert calls == ["a"]  # the step in flight finished; b did not start
    held = WorkflowRun.objects.get(id=run.id)
    assert held.status == RunStatus.PENDING and held.paused_at is not None and held.lease_owner == ""
    assert journal(run)[-3:] == [("operator_action", "pause"), ("step", "a"), ("yielded", "")]
    yielded = JournalEntry.objects.filter(run=run, kind="yielded").get()
    assert yielded.payload == {"reason": "paused by an operator"}

    assert engine_advance(str(run.id), owner="w2") == Outcome.NOT_CLAIMED  # nobody takes a paused run
    assert sweep_once().orphaned == 0

    resumed = resume(run_id=run.id, reason="rounding is fine")
    assert resumed.paused_at is None and resumed.status == RunStatus.PENDING
    done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.result == ["a-done", "b-done", "c-done"]
    assert calls == ["a", "b", "c"]  # nothing ran twice
    action = JournalEntry.objects.get(run=run, kind="operator_action", name="resume")
    assert action.payload["reason"] == "rounding is fine" and action.payload["paused_for_s"] >= 0


def test_a_timer_that_falls_due_during_a_pause_fires_at_resume():
    with frozen_clock():
        run = start("pause_timer", {})
        assert run_until_idle(run.id).status == RunStatus.WAITING
        pause(run_id=run.id, reason="hold the reminder")
        advance_clock(timedelta(hours=2))
        assert sweep_once().woken == 0  # due, but paused: it does not fire
        assert status(run) == RunStatus.WAITING and calls == []

        resume(run_id=run.id, reason="send it now")
        assert status(run) == RunStatus.PENDING  # fired at resume
        fired = JournalEntry.objects.get(run=run, kind="timer_fired")
        assert fired.payload["late_by_ms"] >= 3_600_000  # and says how late
        assert run_until_idle(run.id).status == RunStatus.COMPLETED
        assert calls == ["woke"]


def test_a_workflow_pause_holds_its_runs_and_new_ones_until_it_is_lifted():
    before = start("pause_steps", {}, business_key="w-1")
    pause_workflow("pause_steps", reason="provider incident")
    after = start("pause_steps", {}, business_key="w-2")  # started during the pause: held too
    for run in (before, after):
        assert engine_advance(str(run.id), owner="w1") == Outcome.NOT_CLAIMED
    with pytest.raises(ActionNotAllowed, match="held by the pause of pause_steps"):
        resume(run_id=before.id, reason="only this one")  # the workflow's pause is lifted as a whole
    with pytest.raises(ActionNotAllowed, match="already paused"):
        pause_workflow("pause_steps", reason="again")
    with pytest.raises(ActionNotAllowed, match=r"pause_steps \(version 1\) is not paused"):
        resume_workflow("pause_steps", version=1, reason="not the one that was set")

    assert resume_workflow("pause_steps", reason="incident over") == 2  # both queued again
    for run in (before, after):
        assert run_until_idle(run.id).status == RunStatus.COMPLETED
    assert calls == ["a", "b", "c"] * 2


def test_a_pause_of_one_version_holds_its_runs_until_that_pause_is_lifted():
    run = start("pause_steps", {}, business_key="v-1")
    pause_workflow("pause_steps", version=1, reason="v1 is suspect")
    assert engine_advance(str(run.id), owner="w1") == Outcome.NOT_CLAIMED
    resume_workflow("pause_steps", version=1, reason="fine")
    assert run_until_idle(run.id).status == RunStatus.COMPLETED


def test_pause_and_resume_refuse_what_makes_no_sense_and_change_nothing():
    run = start("pause_steps", {}, business_key="e-1")
    with pytest.raises(ActionNotAllowed, match="a reason is required"):
        pause(run_id=run.id, reason="  ")
    with pytest.raises(ActionNotAllowed, match="is not paused"):
        resume(run_id=run.id, reason="x")
    pause(run_id=run.id, reason="look")
    with pytest.raises(ActionNotAllowed, match="already paused"):
        pause(run_id=run.id, reason="look again")
    resume(run_id=run.id, reason="done looking")
    run_until_idle(run.id)
    with pytest.raises(RunFinished, match="nothing to pause"):
        pause(run_id=run.id, reason="too late")
    with pytest.raises(InvalidArgument, match="no workflow 'no_such_flow'"):
        pause_workflow("no_such_flow", reason="typo")
    pauses = [name for kind, name in journal(run) if kind == "operator_action"]
    assert pauses == ["pause", "resume"]  # the refusals left no trace

"""Move and redrive (``sagas.move`` / ``redrive``) in this process against the real engine and
journal (``sagas.testing``): a run moves only to code its history replays on, checked when it
is asked; a FAILED run goes on from where it failed, its finished steps not run again. With
real workers and the demo providers: ``tests/ledger/test_repair_story.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sagas import ActionNotAllowed, RunFinished, move, pause, redrive, resume, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.testing import advance_clock, frozen_clock, run_until_idle
from tests.sagas import wf_repair

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh():
    wf_repair.calls.clear()
    wf_repair.BROKEN["charge"] = True


def kinds(run) -> list[str]:
    return list(JournalEntry.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))


def test_a_waiting_run_moves_to_the_fixed_version_and_completes_on_it_without_repeating_a_step():
    with frozen_clock():
        run = start("rm_order", {"id": "o-1"}, version=1)
        assert run_until_idle(run.id).status == RunStatus.WAITING
        moved = move(run_id=run.id, version=2, reason="fix for the tax rounding")
        assert (moved.version, moved.status) == (2, RunStatus.WAITING)
        entry = JournalEntry.objects.get(run=run, kind="moved")
        assert (entry.payload["from_version"], entry.payload["to_version"]) == (1, 2)
        assert entry.payload["reason"] == "fix for the tax rounding"

        advance_clock(timedelta(hours=2))
        from sagas.testing import sweep_once
        sweep_once()
        done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.result == {"tax": 20.0}
    assert wf_repair.calls == ["reserve"]  # the step before the move was not run again


def test_a_move_to_code_the_history_does_not_replay_on_is_refused_and_changes_nothing():
    run = start("rm_order", {"id": "o-2"}, version=1)
    run_until_idle(run.id)
    before = kinds(run)
    with pytest.raises(ActionNotAllowed, match=r"does not replay on rm_order version 3: .*reserve_stock"):
        move(run_id=run.id, version=3, reason="try v3")
    assert WorkflowRun.objects.get(id=run.id).version == 1 and kinds(run) == before
    with pytest.raises(ActionNotAllowed, match="already runs rm_order version 1"):
        move(run_id=run.id, version=1, reason="same")
    with pytest.raises(ActionNotAllowed, match="version 9 is not registered in this process"):
        move(run_id=run.id, version=9, reason="typo")


def test_a_failed_run_is_redriven_onto_the_fix_and_completes_keeping_its_id_and_history():
    with frozen_clock():
        run = start("rm_order", {"id": "o-3"}, version=1)
        run_until_idle(run.id)
        advance_clock(timedelta(hours=2))
        from sagas.testing import sweep_once
        sweep_once()
        failed = run_until_idle(run.id)
        assert (failed.status, failed.status_reason) == (RunStatus.FAILED, "workflow_error")
        with pytest.raises(ActionNotAllowed, match="FAILED: redrive it onto version 2"):
            move(run_id=run.id, version=2, reason="moving a failed run alone does nothing")
        redriven = redrive(run_id=run.id, version=2, reason="fix deployed")
        assert (redriven.status, redriven.version, redriven.error) == (RunStatus.PENDING, 2, None)
        done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.result == {"tax": 20.0} and done.id == run.id
    assert wf_repair.calls == ["reserve"]
    assert kinds(run).count("failed") == 1 and "moved" in kinds(run) and "redriven" in kinds(run)


def test_a_failed_step_is_asked_again_on_a_redrive_and_the_steps_before_it_are_not():
    run = start("rm_flaky", {"id": "o-4"})
    failed = run_until_idle(run.id)
    assert (failed.status, failed.status_reason) == (RunStatus.FAILED, "step_failed")
    wf_repair.BROKEN["charge"] = False  # the provider answers again
    redrive(run_id=run.id, reason="processor is back")
    done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.result == {"charge": "charged", "after": "after-done"}
    assert wf_repair.calls == ["reserve", "charge", "charge", "after"]
    steps = list(JournalEntry.objects.filter(run=run, kind="step").values_list("name", flat=True))
    assert steps == ["reserve", "charge", "charge", "after"]  # the failure stays in the history
    with pytest.raises(ActionNotAllowed, match="only a FAILED run"):
        redrive(run_id=run.id, reason="again")
    with pytest.raises(RunFinished, match="only a run that has not finished can be moved"):
        move(run_id=run.id, version=1, reason="a completed run")


def test_a_paused_run_can_be_moved_and_waits_for_its_resume():
    run = start("rm_order", {"id": "o-5"}, version=1)
    pause(run_id=run.id, reason="hold it while we deploy the fix")
    moved = move(run_id=run.id, version=2, reason="fix")
    assert moved.version == 2 and moved.paused_at is not None
    resume(run_id=run.id, reason="deployed")
    assert run_until_idle(run.id).status == RunStatus.WAITING

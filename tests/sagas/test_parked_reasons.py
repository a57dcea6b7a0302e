"""No run stays parked for a reason that no longer holds: the sweeper re-checks runs parked for
UNKNOWN effects and resumes each whose effects have all been settled since, however that came
about (the case with real processes, a worker frozen past its lease, is in
``tests/ledger/test_effect_windows.py``)."""

from __future__ import annotations

import pytest

from ledger.models import EffectStatus
from sagas.models import JournalEntry, JournalKind, RunStatus, WorkflowRun
from sagas.testing import sweep_once
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db


def test_the_sweeper_resumes_a_run_parked_for_an_effect_that_has_been_settled_since():
    settled = make_run(reason="effect_unknown")
    make_effect(run=settled, status=EffectStatus.SUCCEEDED)  # settled without waking its run
    still = make_run(reason="effect_unknown")
    make_effect(run=still, step="capture", status=EffectStatus.SUCCEEDED)
    make_effect(run=still, step="email", status=EffectStatus.UNKNOWN)  # one is still unknown: stays
    compensating = make_run(reason="compensation_unknown")
    make_effect(run=compensating, status=EffectStatus.SUCCEEDED)
    other = make_run(reason="non_determinism")  # a reason no ledger answer takes away

    report = sweep_once()

    assert report.resumed == 2, report
    states = dict(WorkflowRun.objects.values_list("id", "status"))
    assert states[settled.id] == RunStatus.PENDING
    assert states[compensating.id] == RunStatus.COMPENSATING
    assert states[still.id] == RunStatus.NEEDS_ATTENTION
    assert states[other.id] == RunStatus.NEEDS_ATTENTION
    resumed = JournalEntry.objects.get(run=settled, kind=JournalKind.RESUMED)
    assert "settled" in resumed.payload["reason"], resumed.payload  # the history says why
    assert sweep_once().resumed == 0  # and nothing twice


def test_the_sweeper_resumes_a_run_whose_escalated_approval_was_closed_or_whose_budget_has_room_again():
    from datetime import timedelta

    from django.utils import timezone

    from sagas.models import ApprovalState
    from tests.console.queue_data import make_approval

    decided = make_run(reason="approval_escalated")
    make_approval(run=decided, state=ApprovalState.APPROVED)  # decided while its wake-up was lost
    waiting = make_run(reason="approval_escalated")
    make_approval(run=waiting, state=ApprovalState.ESCALATED)  # still open: a person must decide
    raised = make_run(reason="budget_exceeded", error={"budget": "steps"}, steps_used=10, max_steps=20)
    spent = make_run(reason="budget_exceeded", error={"budget": "steps"}, steps_used=10, max_steps=10)
    late = make_run(reason="budget_exceeded", error={"budget": "duration"}, max_duration=timedelta(minutes=1),
                    started_at=timezone.now() - timedelta(minutes=5))

    report = sweep_once()

    states = dict(WorkflowRun.objects.values_list("id", "status"))
    assert {states[decided.id], states[raised.id]} == {RunStatus.PENDING}, report
    assert {states[waiting.id], states[spent.id], states[late.id]} == {RunStatus.NEEDS_ATTENTION}
    assert "approval was decided" in JournalEntry.objects.get(run=decided, kind=JournalKind.RESUMED).payload["reason"]
    assert "budget has room" in JournalEntry.objects.get(run=raised, kind=JournalKind.RESUMED).payload["reason"]
    assert sweep_once().resumed == 0

"""An effect resolution or an approval decision must say which state its sender saw (the form's
``expected``): without it nothing is attempted (400), and the attempt is audited; a viewer is
denied before that is even looked at."""

from __future__ import annotations

import pytest

from ledger.models import EffectStatus
from operators.models import AuditOutcome
from sagas.models import (
    ApprovalState,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from tests.console.race_moves import (
    clients_for,
    decide_move,
    resolve_move,
    unknown_effect,
    waiting_run,
)

pytestmark = pytest.mark.django_db


def test_it_refuses_an_effect_resolution_that_does_not_say_what_was_seen(people):
    effect = unknown_effect("no-expected-effect")
    move = resolve_move("olga", "succeeded", effect)
    del move.form["expected"]

    response = clients_for(people)["olga"].post(move.url, move.form)

    assert response.status_code == 400
    assert "which state you saw" in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and effect.resolved_at is None
    assert WorkflowRun.objects.get(id=effect.run_id).status == RunStatus.NEEDS_ATTENTION
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.REFUSED and entry.actor_label == "olga"
    assert entry.before["state"] == "UNKNOWN" and "which state you saw" in entry.message


def test_it_refuses_an_approval_decision_that_does_not_say_what_was_seen(people):
    run, approval = waiting_run("no-expected-approval")
    move = decide_move("ann", "approve", approval)
    move.form["expected"] = ""

    response = clients_for(people)["ann"].post(move.url, move.form)

    assert response.status_code == 400
    assert "which state you saw" in response.content.decode()
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.state == ApprovalState.PENDING and run.status == RunStatus.WAITING
    assert not JournalEntry.objects.filter(run=run, kind="approval_decided").exists()
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.REFUSED and entry.before["state"] == "PENDING"


def test_it_still_denies_a_viewer_before_looking_at_expected(people):
    run, approval = waiting_run("viewer-no-expected")
    move = decide_move("vera", "approve", approval)
    del move.form["expected"]
    response = clients_for(people)["vera"].post(move.url, move.form)
    assert response.status_code == 403
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.DENIED
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING

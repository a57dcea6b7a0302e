"""Re-run from a step on the console: the preview (each effect's fate, irreversible ones marked,
the budget stated, what blocks it), the confirmation, the links both ways, roles and audit."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.models import EffectStatus
from operators.models import AuditOutcome
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.run_data import audits, run_url, text, waiting_run

pytestmark = pytest.mark.django_db


def seq_of(run, kind: str, name: str) -> int:
    return JournalEntry.objects.get(run=run, kind=kind, name=name).seq


def test_an_operator_previews_and_makes_a_re_run_from_a_step_and_both_runs_link_to_each_other(people):
    run = waiting_run("o-fork")  # charge, then the irreversible ship, then an approval
    client = client_for(people["operator"])
    assert reverse("console:run_fork", args=[run.id]) in text(client.get(run_url(run)))

    ship = seq_of(run, "effect_intent", "ship")
    page = text(client.get(reverse("console:run_fork", args=[run.id]), {"at": ship}))
    assert "<strong>kept</strong>: before the step" in page  # charge
    assert "<strong>reused</strong>: done after the step" in page  # ship
    assert 'class="badge IRREVERSIBLE"' in page and "counted against" in page
    before = JournalEntry.objects.filter(run=run).count()
    assert JournalEntry.objects.filter(run=run).count() == before  # previewing wrote nothing

    assert 'name="forks_seen" value="0"' in page
    form = {"at": ship, "reason": "ship again after the label fix", "expected": run.status, "version": "",
            "forks_seen": "0"}
    answer = client.post(reverse("console:run_fork", args=[run.id]), form)
    assert answer.status_code == 302
    twice = client.post(reverse("console:run_fork", args=[run.id]), form)  # the same page submitted again
    assert twice.status_code == 409 and "re-run from a step 1 time(s), not 0" in text(twice)
    assert WorkflowRun.objects.filter(forked_from=run.id).count() == 1
    fork = WorkflowRun.objects.get(forked_from=run.id)
    assert answer["Location"] == run_url(fork) and (fork.forked_at_seq, fork.status) == (ship, RunStatus.PENDING)
    outcomes = [e.outcome for e in sorted(audits(run, "run.fork"), key=lambda e: e.id)]
    assert outcomes == [AuditOutcome.OK, AuditOutcome.REFUSED]  # the second submit is refused and audited
    assert str(fork.id)[:8] in text(client.get(run_url(run)))  # the source links to the new run
    assert str(run.id) in text(client.get(run_url(fork)))  # and back


def test_an_unknown_effect_blocks_a_re_run_and_a_viewer_is_denied(people):
    run = waiting_run("o-fork-2")
    from ledger.models import EffectRecord
    EffectRecord.objects.filter(run_id=run.id, step_name="charge").update(status=EffectStatus.UNKNOWN)
    client = client_for(people["operator"])
    at = seq_of(run, "effect_intent", "ship")
    page = text(client.get(reverse("console:run_fork", args=[run.id]), {"at": at}))
    assert "It cannot be done now" in page and "resolve it first" in page
    refused = client.post(reverse("console:run_fork", args=[run.id]),
                          {"at": at, "reason": "try", "expected": run.status, "version": ""})
    assert refused.status_code == 409 and not WorkflowRun.objects.filter(forked_from=run.id).exists()
    denied = client_for(people["viewer"]).post(reverse("console:run_fork", args=[run.id]),
                                               {"at": at, "reason": "x", "expected": run.status, "version": ""})
    assert denied.status_code == 403
    assert client.post(reverse("console:run_fork", args=[run.id]),
                       {"reason": "no step", "expected": run.status, "version": ""}).status_code == 400


def test_a_re_run_with_compensation_first_previews_the_undo_refunds_before_going_on_and_says_so(people):
    from ledger.models import EffectRecord
    from sagas.replay.engine import advance

    run = waiting_run("o-fork-3")  # charge (compensable), then ship (irreversible), then an approval
    client = client_for(people["operator"])
    charge = seq_of(run, "effect_intent", "charge")
    url = reverse("console:run_fork", args=[run.id])
    page = text(client.get(url, {"at": charge, "undo": "1"}))
    assert "compensating later effects first" in page and 'name="undo" value="1" checked' in page
    assert "<strong>undone</strong>: compensated first" in page  # charge
    assert "<strong>reused</strong>: irreversible, so it cannot be compensated" in page  # ship
    assert 'type="hidden" name="undo" value="1"' in page

    answer = client.post(url, {"at": charge, "undo": "1", "reason": "charged the wrong amount", "expected": run.status,
                               "version": "", "forks_seen": "0"})
    assert answer.status_code == 302, text(answer)[:3000]
    fork = WorkflowRun.objects.get(forked_from=run.id)
    forked = JournalEntry.objects.get(run=fork, kind="forked")
    assert [u["name"] for u in forked.payload["undo"]] == ["charge"] and forked.payload["reuse"] == {"ship": f"{run.id}:ship"}
    assert audits(run, "run.fork")[0].outcome == AuditOutcome.OK

    advance(str(fork.id), owner="t")  # undo first, then the workflow from the charge on
    fork.refresh_from_db()
    assert fork.status == RunStatus.WAITING  # at the approval again
    refund = EffectRecord.objects.get(idempotency_key=f"{run.id}:charge:compensate")
    assert (refund.kind, refund.status, str(refund.run_id)) == ("compensation", EffectStatus.SUCCEEDED, str(fork.id))
    assert EffectRecord.objects.get(idempotency_key=f"{fork.id}:charge").status == EffectStatus.SUCCEEDED  # anew
    assert not EffectRecord.objects.filter(idempotency_key=f"{fork.id}:ship").exists()  # reused, not shipped again
    history = text(client.get(reverse("console:run_history", args=[fork.id])))
    assert f"of run {run.id} by olga, compensating first: charge: charged the wrong amount" in history
    source_page = text(client.get(run_url(run)))
    assert f"as run {fork.id} by olga: charged the wrong amount" in source_page

    # The charge is undone now: a later re-run does it again under its own key, never reuses it.
    later = text(client.get(url, {"at": charge}))
    assert "<strong>again</strong>: undone since by a compensation" in later


def test_compensating_first_is_refused_for_an_effect_an_earlier_re_run_reuses(people):
    from sagas import fork, fork_preview

    run = waiting_run("o-fork-4")
    charge = seq_of(run, "effect_intent", "charge")
    reusing = fork(run_id=run.id, at_seq=charge, reason="again, reusing")
    plan = fork_preview(run_id=run.id, at_seq=charge, compensate_first=True)
    assert not plan.possible and f"the re-run {reusing.id} reuses its outcome" in " ".join(plan.blockers)
    client = client_for(people["operator"])
    refused = client.post(reverse("console:run_fork", args=[run.id]),
                          {"at": charge, "undo": "1", "reason": "undo it", "expected": run.status, "version": "",
                           "forks_seen": "1"})
    assert refused.status_code == 409 and "reuses its outcome" in text(refused)
    assert WorkflowRun.objects.filter(forked_from=run.id).count() == 1

"""A model that is down is not the run's failure: the request is asked again under the same
key, and if the model stays down the run parks as model_unavailable (nothing journaled for
that turn, nothing compensated) until a person retries it."""

from __future__ import annotations

import pytest

from demo.providers.faults import inject
from ledger.models import EffectRecord
from sagas import retry, start
from sagas.models import JournalEntry, RunStatus
from tests.agents import wf_agents  # noqa: F401
from tests.agents.runs import CAPTURE, billed, cached, script, wait_finished

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_asks_a_model_that_answered_503_again_under_the_same_key_and_bills_the_turn_once(stack):
    inject("model", "complete", "error_before_work", times=2)  # the gateway is down for two requests
    run = start("agent_order", {"script": script(CAPTURE, "Paid o-1.")})
    stack.worker("w1")
    run = wait_finished(run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert (billed(), cached()) == (2, 0)  # two turns, each billed once, though turn 1 was sent three times
    assert EffectRecord.objects.filter(run_id=run.id, step_name="capture_payment").count() == 1


def test_it_parks_a_run_whose_model_stays_down_and_a_retry_goes_on_from_that_turn(stack, django_user_model):
    run = start("agent_order", {"script": script(CAPTURE, "Paid o-1.")})
    inject("model", "complete", "error_before_work", times=1000)
    stack.worker("w1", SAGAS_AGENT_MODEL_ATTEMPTS="2")
    run = wait_finished(run)
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "model_unavailable")
    assert run.error["attempts"] == 2 and run.error["turn"] == 1, run.error
    assert not JournalEntry.objects.filter(run_id=run.id, name__startswith="agent.model").exists()
    assert billed() == 0

    from demo.models import ProviderFault

    ProviderFault.objects.all().delete()  # the gateway is back
    retry(run_id=run.id, reason="gateway restored", user=django_user_model.objects.create(username="ops"))
    run = wait_finished(run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert (billed(), cached()) == (2, 0)
    assert EffectRecord.objects.filter(run_id=run.id, step_name="capture_payment").count() == 1

"""Each effect record carries its run's workflow and business key (copied by a trigger when it
is inserted, ``sagas.store.effect_context``): the ambiguous-effects queue filters and searches
on them without looking up each effect's run."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.urls import reverse

from ledger.models import EffectRecord, EffectStatus
from tests.console.conftest import client_for
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db


def test_a_recorded_effect_carries_its_runs_workflow_and_business_key_whatever_the_writer_gave():
    run = make_run(business_key="ORD-<b>4471</b>")
    effect = make_effect(run=run, workflow_name="something_else", business_key="typed by hand")
    effect.refresh_from_db()
    assert (effect.workflow_name, effect.business_key) == (run.workflow_name, "ORD-<b>4471</b>")


def test_an_effect_whose_run_is_not_there_keeps_what_its_writer_gave():
    effect = make_effect(run=make_run(), run_id=uuid.uuid4(), workflow_name="restored", business_key="K-1")
    effect.refresh_from_db()
    assert (effect.workflow_name, effect.business_key) == ("restored", "K-1")


def test_the_queue_finds_an_effect_by_its_runs_workflow_and_key_from_the_effects_own_columns(people):
    wanted = make_effect(run=make_run(name="kyc_check", business_key="KYC-77310"), step="wanted_step")
    make_effect(run=make_run(name="order_fulfilment", business_key="ORD-77310"), step="unwanted_step")
    client = client_for(people["viewer"])
    # The queue reads the columns, not the runs: a run renamed behind its back (which the product
    # never does) no longer moves its effect.
    with connection.cursor() as cur:
        cur.execute("UPDATE sagas_workflowrun SET workflow_name = 'renamed', business_key = 'gone' WHERE id = %s",
                    [wanted.run_id])
    by_workflow = client.get(reverse("console:effects"), {"workflow": "kyc_check"}).content.decode()
    assert "wanted_step" in by_workflow and "unwanted_step" not in by_workflow
    by_key = client.get(reverse("console:effects"), {"q": "kyc-773"}).content.decode()
    assert "wanted_step" in by_key and "unwanted_step" not in by_key
    assert EffectRecord.objects.filter(status=EffectStatus.UNKNOWN, business_key="KYC-77310").count() == 1

"""The key index of archived effects (``ledger.keyindex``) on the intent path: once retention
deleted an effect's record, its key still deduplicates, until it expires."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import Connector, connector
from ledger.errors import EffectFailed, KeyConflict
from ledger.journal import EFFECT_KINDS
from ledger.keyindex import keys_purge
from ledger.models import EffectKeyIndex, EffectRecord
from ledger.protocol import run_effect
from ledger.services import payload_hash
from tests.ledger.test_protocol import Died, ListJournal

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[str] = []
PAYMENT = {"order": "o-77", "amount_cents": 1200}


@connector("keyindex.charge")
class KeyIndexCharge(Connector):
    def execute(self, payload, *, key):
        CALLS.append(key)
        return {"id": f"tx-new-{key}"}


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()


def archived(key: str, *, status: str = "SUCCEEDED", payload: dict = PAYMENT, expires_in: float = 86400) -> None:
    EffectKeyIndex.objects.create(
        tenant="t-protocol", idempotency_key=key, payload_hash=payload_hash(payload), connector="keyindex.charge",
        status=status, result={"id": "tx-first"} if status == "SUCCEEDED" else None,
        downstream_ref="tx-first" if status == "SUCCEEDED" else "", error_class="Final" if status != "SUCCEEDED" else "",
        error_message="card declined" if status != "SUCCEEDED" else "", run_id=uuid.uuid4(), step_name="charge",
        expires_at=timezone.now() + timedelta(seconds=expires_in),
    )


def charge(journal: ListJournal, payload: dict = PAYMENT) -> object:
    return run_effect(journal, name="charge", connector_name="keyindex.charge", payload=payload, key="pay-o-77")


def test_it_returns_the_archived_outcome_without_calling_the_provider():
    archived("pay-o-77")
    journal = ListJournal()
    assert charge(journal) == {"id": "tx-first"}
    assert CALLS == [] and not EffectRecord.objects.exists()
    assert journal.kinds() == [EFFECT_KINDS.intent, EFFECT_KINDS.result]
    assert journal.entries[0].payload["reused"] is True


def test_it_raises_the_archived_failure_and_refuses_another_payload():
    archived("pay-o-77", status="FAILED_FINAL")
    with pytest.raises(EffectFailed, match="card declined"):
        charge(ListJournal())
    with pytest.raises(KeyConflict, match="already used"):
        charge(ListJournal(), {**PAYMENT, "amount_cents": 9999})
    assert CALLS == []


def test_it_recovers_from_the_index_after_a_crash_between_intent_and_outcome():
    archived("pay-o-77")
    first = ListJournal(die_at="after_outcome")
    with pytest.raises(Died):
        charge(first)
    assert first.kinds() == [EFFECT_KINDS.intent]
    assert charge(first.recover()) == {"id": "tx-first"}
    assert CALLS == []


def test_an_expired_key_is_free_again_and_purged():
    archived("pay-o-77", expires_in=-1)
    assert charge(ListJournal()) == {"id": "tx-new-pay-o-77"}
    assert CALLS == ["pay-o-77"]
    assert keys_purge() == 1 and not EffectKeyIndex.objects.exists()

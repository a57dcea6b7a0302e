"""A small chaos run: 50 three-effect orders, two workers SIGKILLed at random and restarted."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from demo.providers.faults import inject
from demo.providers.selectors import executions
from ledger.models import EffectRecord, EffectStatus
from sagas import start
from sagas.models import RunStatus, WorkflowRun
from tests.ledger import wf_orders  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
SETTLED = (RunStatus.COMPLETED, RunStatus.NEEDS_ATTENTION)


def test_it_loses_no_run_and_duplicates_no_keyed_effect_under_random_kills(stack):
    for provider, operation in (("payments", "capture"), ("inventory", "reserve"), ("email", "send")):
        inject(provider, operation, "latency:0.05", times=10_000)  # keep work in flight when the kills land
    runs = [start("order3", {"id": f"chaos-{i:02d}"}) for i in range(50)]
    ids = [run.id for run in runs]
    rng = random.Random(20261129)
    workers = {"a": stack.worker("a0"), "b": stack.worker("b0")}
    kills = 0
    deadline = time.monotonic() + 240
    while WorkflowRun.objects.filter(id__in=ids).exclude(status__in=SETTLED).exists():
        assert time.monotonic() < deadline, Counter(WorkflowRun.objects.values_list("status", flat=True))
        time.sleep(rng.uniform(1.0, 3.0))
        if kills < 12:
            slot = rng.choice(sorted(workers))
            workers[slot].kill()
            kills += 1
            workers[slot] = stack.worker(f"{slot}{kills}")
    assert kills >= 3, "the chaos run ended before enough kills landed to mean anything"

    statuses = Counter(WorkflowRun.objects.filter(id__in=ids).values_list("status", flat=True))
    assert sum(statuses.values()) == 50 and set(statuses) <= set(SETTLED), statuses
    for run in WorkflowRun.objects.filter(id__in=ids, status=RunStatus.NEEDS_ATTENTION):
        assert run.status_reason == "effect_unknown", (run.id, run.status_reason, run.error)
        assert EffectRecord.objects.filter(run_id=run.id, status=EffectStatus.UNKNOWN).exists()

    for provider, operation in (("payments", "capture"), ("inventory", "reserve"), ("email", "send")):
        per_key = Counter(executions(provider, operation).values_list("idempotency_key", flat=True))
        duplicates = {key: n for key, n in per_key.items() if n > 1}
        assert duplicates == {}, (provider, duplicates)
    # Every completed run's charge is the one the provider actually made.
    captured = set(executions("payments", "capture").values_list("response__transaction_id", flat=True))
    for run in WorkflowRun.objects.filter(id__in=ids, status=RunStatus.COMPLETED):
        assert run.result["transaction_id"] in captured
    print(f"chaos: {kills} kills, statuses {dict(statuses)}")

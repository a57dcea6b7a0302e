"""Runs per (tenant, status, reason), and runs in flight per version, kept by triggers as runs
change (``sagas.store.counts``): always equal to counting the runs, through starts, the
engine's transitions, cancels, moves to another version, bulk inserts and deletes, and the
sweeper's folding; the engine's per-step updates write nothing."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

from sagas import cancel, start
from sagas.models import InFlightCountDelta, RunCountDelta, RunStatus, WorkflowRun
from sagas.store import counts
from sagas.testing import run_until_idle, sweep_once
from tests.sagas import wf_repair

pytestmark = pytest.mark.django_db(transaction=True)


def counted_by_hand(tenants=None) -> dict[tuple[str, str], int]:
    runs = WorkflowRun.objects.all() if tenants is None else WorkflowRun.objects.filter(tenant__in=tenants)
    return dict(Counter(runs.values_list("status", "status_reason")))


def in_flight_by_hand(tenants=None) -> dict[tuple[str, int, str, str], int]:
    runs = WorkflowRun.objects.filter(status__in=counts.IN_FLIGHT)
    if tenants is not None:
        runs = runs.filter(tenant__in=tenants)
    return dict(Counter(runs.values_list("workflow_name", "version", "definition_hash", "status")))


def test_the_counts_equal_counting_the_runs_through_a_run_s_life_and_the_sweeper_s_folding():
    wf_repair.BROKEN["charge"] = True
    waiting = start("rm_order", {"id": "c-1"}, version=1, tenant="acme")
    flaky = start("rm_flaky", {"id": "c-2"}, tenant="globex")
    assert counts.run_counts() == counted_by_hand() == {(RunStatus.PENDING, ""): 2}
    assert counts.in_flight_counts() == in_flight_by_hand() and sum(counts.in_flight_counts().values()) == 2
    run_until_idle(waiting.id)
    run_until_idle(flaky.id)
    assert counts.run_counts() == counted_by_hand()
    assert counts.in_flight_counts() == in_flight_by_hand()
    assert counts.in_flight_counts(tenants=["acme"]) == in_flight_by_hand(["acme"])
    assert set(counts.in_flight_counts(tenants=["acme"])) == {("rm_order", 1, waiting.definition_hash,
                                                                 RunStatus.WAITING)}
    assert counts.run_counts(tenants=["acme"]) == counted_by_hand(["acme"]) == {(RunStatus.WAITING, ""): 1}

    before = RunCountDelta.objects.count()
    WorkflowRun.objects.filter(id=waiting.id).update(last_seq=99, steps_used=3)  # what every step does
    assert RunCountDelta.objects.count() == before  # no delta for it

    flights = InFlightCountDelta.objects.count()
    WorkflowRun.objects.filter(id=waiting.id).update(last_seq=100, steps_used=4)
    assert InFlightCountDelta.objects.count() == flights  # no delta for a step either
    # A repair moves a waiting run to another version: it leaves one key and joins the other.
    WorkflowRun.objects.filter(id=waiting.id).update(version=2, definition_hash="f" * 64)
    assert counts.in_flight_counts(tenants=["acme"]) == in_flight_by_hand(["acme"]) == {
        ("rm_order", 2, "f" * 64, RunStatus.WAITING): 1}

    cancel(run_id=waiting.id, reason="customer withdrew", compensate=False)
    sweep_once()  # folds the deltas into the totals
    assert RunCountDelta.objects.count() == 0 and InFlightCountDelta.objects.count() == 0
    assert counts.run_counts() == counted_by_hand()
    assert counts.in_flight_counts() == in_flight_by_hand()
    assert counts.in_flight_counts(tenants=["acme"]) == {}  # cancelled: no longer in flight
    acme = counts.run_counts(tenants=["acme"])
    assert acme == counted_by_hand(["acme"]) and sum(acme.values()) == 1
    assert next(iter(acme))[0] == RunStatus.CANCELLED


def test_bulk_inserts_and_deletes_are_counted_per_statement_and_a_rebuild_recounts():
    WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_name="bulk", version=1, definition_hash="a" * 64, tenant=f"t{i % 3}",
                    status=RunStatus.COMPLETED if i % 2 else RunStatus.FAILED,
                    status_reason="" if i % 2 else "workflow_error")
        for i in range(300))
    assert RunCountDelta.objects.count() <= 6  # one delta per key, not one per run
    assert counts.run_counts() == counted_by_hand()
    WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_name="bulk", version=1 + i % 2, definition_hash="ab"[i % 2] * 64, tenant=f"t{i % 3}",
                    status=RunStatus.WAITING if i % 3 else RunStatus.PENDING) for i in range(60))
    assert InFlightCountDelta.objects.count() <= 12  # per key, not per run
    assert counts.in_flight_counts() == in_flight_by_hand() and sum(counts.in_flight_counts().values()) == 60
    WorkflowRun.objects.filter(tenant="t1").delete()
    assert counts.run_counts() == counted_by_hand() and counts.run_counts(tenants=["t1"]) == {}
    assert counts.in_flight_counts() == in_flight_by_hand() and counts.in_flight_counts(tenants=["t1"]) == {}

    with connection.cursor() as cur:  # a load that bypasses the triggers, as bench/console.py's
        cur.execute("SET session_replication_role = replica")
        cur.execute("""INSERT INTO sagas_workflowrun (id, workflow_name, version, definition_hash, input, summary,
                           business_key, tenant, status, status_reason, lease_owner, fence, attempts, last_seq,
                           steps_used, cost_used, created_at, updated_at, started_via)
                       SELECT gen_random_uuid(), 'bulk', 1, repeat('a', 64), '{}', '{}', '', 't9', 'WAITING', '',
                              '', 0, 0, 0, 0, 0, now(), now(), 'api' FROM generate_series(1, 5)""")
        cur.execute("SET session_replication_role = DEFAULT")
    assert counts.run_counts() != counted_by_hand()  # behind, as the module says
    assert counts.in_flight_counts() != in_flight_by_hand()
    counts.rebuild()
    assert counts.run_counts() == counted_by_hand()
    assert counts.in_flight_counts() == in_flight_by_hand()

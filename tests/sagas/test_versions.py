"""Definition hashes and side-by-side versions, with real worker processes."""

from __future__ import annotations

import pytest

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun, WorkflowVersion
from sagas.versions import registry
from tests.procs import wait_until
from tests.sagas import wf_multi_new, wf_versions_a  # noqa: F401  (register in this process)

pytestmark = pytest.mark.django_db(transaction=True)


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def test_it_parks_a_run_started_under_another_hash_and_resumes_it_when_that_hash_returns(procs, step_calls):
    run = start("versioned", {})
    hash_a = registry.get("versioned", 1).definition_hash
    procs.worker("w_b", "tests.sagas.wf_versions_b")
    wait_until(lambda: status(run) == RunStatus.NEEDS_ATTENTION, 20, what="the run to be parked")
    run.refresh_from_db()
    assert run.status_reason == "version_mismatch"
    assert run.error["run_hash"] == hash_a
    [hash_b] = WorkflowVersion.objects.filter(name="versioned").exclude(definition_hash=hash_a).values_list(
        "definition_hash", flat=True
    )  # registered by w_b at start-up
    assert run.error["live_hashes_for_version"] == [hash_b]
    assert "no live worker has the code this run started with" in run.error["message"]
    assert step_calls.counts(run.id) == {}  # nothing ran under the wrong code
    # Both hashes are on record, each with its source, for the versions page's diff.
    sources = dict(WorkflowVersion.objects.filter(name="versioned").values_list("definition_hash", "source"))
    assert len(sources) == 2 and "finished on A" in sources[hash_a]

    procs.worker("w_a", "tests.sagas.wf_versions_a")  # re-registering A's code un-strands the run
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 20, what="the run to finish on A")
    run.refresh_from_db()
    assert run.result == "finished on A"
    assert JournalEntry.objects.filter(run=run, kind="resumed").count() == 1


def test_it_finishes_a_version_2_run_on_version_2_while_version_3_is_registered(procs, step_calls):
    old_run = start("multi", {}, version=2)
    procs.worker("old", "tests.sagas.wf_multi_old", SAGAS_CRASH_AT="after_step_record:fetch")
    wait_until(lambda: not procs.procs[0].alive(), 20, what="the old deployment's worker to crash")
    assert step_calls.counts(old_run.id) == {"fetch": 1}

    new_run = start("multi", {})  # the newest registered version by default
    assert new_run.version == 3
    procs.worker("new", "tests.sagas.wf_multi_new")
    wait_until(lambda: status(old_run) == status(new_run) == RunStatus.COMPLETED, 20, what="both runs")
    old_run.refresh_from_db()
    new_run.refresh_from_db()
    assert (old_run.version, old_run.result) == (2, "v2")
    assert (new_run.version, new_run.result) == (3, "v3")
    assert step_calls.counts(old_run.id) == {"fetch": 1, "decide": 1}
    assert step_calls.counts(new_run.id) == {"fetch": 1, "score": 1, "decide": 1}

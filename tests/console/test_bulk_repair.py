"""Bulk move and redrive on the console: a batch of runs moved to the fix, each checked against
the target code when the job reaches it (a run that does not replay on it is refused with where,
and left as it was), one audit entry per run and one for the batch."""

from __future__ import annotations

import pytest

from console.models import BulkItem
from console.services.bulk import batch_work
from operators.models import AuditEntry
from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun, WorkflowVersion
from sagas.testing import run_until_idle
from sagas.versions import registry
from tests.console.conftest import client_for
from tests.console.run_data import text
from tests.console.test_bulk_actions import confirm, preview, token_of
from tests.sagas import wf_repair  # noqa: F401  (rm_order versions 1 to 3 in this process)

pytestmark = pytest.mark.django_db


def test_a_bulk_move_moves_the_runs_that_replay_on_the_fix_and_refuses_the_one_that_does_not(people):
    for d in registry.all_definitions():
        if d.name == "rm_order":
            WorkflowVersion.objects.get_or_create(name=d.name, version=d.version, definition_hash=d.definition_hash,
                                                  defaults={"source": d.source, "module": d.module})
    on_v1 = []
    for i in range(3):
        run = start("rm_order", {"id": f"b-{i}"}, version=1, business_key=f"b-{i}")
        run_until_idle(run.id)
        on_v1.append(run)
    diverged = start("rm_order", {"id": "b-v3"}, version=3, business_key="b-v3")  # its history has reserve_stock
    run_until_idle(diverged.id)

    client = client_for(people["operator"])
    token = token_of(preview(client, "run.move", workflow="rm_order"))
    page = text(client.get(f"/bulk/{token}/"))
    assert '<option value="2">version 2</option>' in page and "checked against that version" in page
    assert confirm(client, token).status_code == 400  # no version chosen: nothing queued
    assert confirm(client, token, version="two").status_code == 400
    assert confirm(client, token, version="2").status_code == 302

    from console.models import BulkBatch
    batch = BulkBatch.objects.get(token=token)
    assert batch_work(batch_id=batch.id) == "done"
    batch.refresh_from_db()
    assert (batch.ok, batch.refused, batch.version) == (3, 1, 2)
    assert {WorkflowRun.objects.get(id=r.id).version for r in on_v1} == {2}
    assert WorkflowRun.objects.get(id=diverged.id).version == 3  # left as it was
    refused = BulkItem.objects.get(batch=batch, object_id=str(diverged.id))
    assert refused.outcome == "refused" and "does not replay on rm_order version 2" in refused.message
    assert JournalEntry.objects.filter(kind="moved").count() == 3
    assert AuditEntry.objects.filter(action="run.move", outcome="ok").count() == 3
    assert AuditEntry.objects.filter(action="bulk.run.move", outcome="ok").get().after["version"] == 2
    assert {WorkflowRun.objects.get(id=r.id).status for r in on_v1} == {RunStatus.WAITING}

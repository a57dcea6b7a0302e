"""Retention: finished runs past their age are written to a day's archive file, then deleted
through the one path the journal's trigger allows, one audit entry per batch; what is not due
stays; a failure between the file and the commit loses nothing."""

from __future__ import annotations

import gzip
import json
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from console.models import AuditEntry
from ledger.models import EffectKeyIndex, EffectRecord
from sagas import approve, get_run, start
from sagas.archive import FileStore, member_lines, run_lines, store_for_location
from sagas.engine import advance
from sagas.models import (
    ApprovalRequest,
    ArchivedRun,
    CompensationItem,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from sagas.retention import archive_due, due_count, retention_for
from tests.sagas.wf_retention import charges

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def archive_dir(tmp_path, settings):
    settings.SAGAS_ARCHIVE_URL = (tmp_path / "archive").as_uri()
    return tmp_path / "archive"


def finish(name: str, spec: dict, **options) -> WorkflowRun:
    run = start(name, spec, **options)
    for _ in range(4):
        advance(str(run.id), owner="t")
        run.refresh_from_db()
        if run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATED, RunStatus.WAITING):
            break
    return run


def finish_waiting(run: WorkflowRun) -> WorkflowRun:
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    return run


def age(run: WorkflowRun, days: float) -> None:
    """Make ``run`` look finished ``days`` ago."""
    WorkflowRun.objects.filter(id=run.id).update(finished_at=timezone.now() - timedelta(days=days))


def db_rows(run_id) -> dict:
    """What the database holds of a run, as the archive's lines should say it."""
    with connection.cursor() as cur:
        out = {}
        for kind, sql in [
            ("run", "SELECT row_to_json(t)::text FROM sagas_workflowrun t WHERE id = %s"),
            ("journal", "SELECT row_to_json(t)::text FROM sagas_journalentry t WHERE run_id = %s ORDER BY seq"),
            ("effect", "SELECT row_to_json(t)::text FROM ledger_effectrecord t WHERE run_id = %s ORDER BY id"),
            ("approval", "SELECT row_to_json(t)::text FROM sagas_approvalrequest t WHERE run_id = %s ORDER BY id"),
            ("compensation_plan", "SELECT row_to_json(t)::text FROM sagas_compensationplan t WHERE run_id = %s"),
            ("compensation_item", """SELECT row_to_json(t)::text FROM sagas_compensationitem t
                 JOIN sagas_compensationplan p ON p.id = t.plan_id WHERE p.run_id = %s ORDER BY t.position"""),
        ]:
            cur.execute(sql, [str(run_id)])
            out[kind] = [json.loads(row[0]) for row in cur.fetchall()]
    return out


def from_archive(run_id) -> dict:
    archived = ArchivedRun.objects.get(run_id=run_id)
    lines = run_lines(store_for_location(archived.location), archived.location, archived.offset, archived.length,
                      str(run_id))
    out: dict = {k: [] for k in ("run", "journal", "effect", "approval", "compensation_plan", "compensation_item")}
    for line in lines:
        kind = line.pop("type")
        if kind in ("run", "compensation_item"):
            line.pop("run_id")
        out[kind].append(line)
    return out


def test_it_archives_a_finished_run_to_its_days_file_exactly_as_the_database_held_it(archive_dir):
    done = finish("ret_order", {"id": "o-1", "approve": True})
    assert done.status == RunStatus.WAITING
    approve(run_id=done.id, name="go_on", user=get_user_model().objects.create(username="ann"), comment="ok")
    done = finish_waiting(done)
    assert done.status == RunStatus.COMPLETED
    failed = finish("ret_order", {"id": "o-2", "fail": True})
    assert failed.status == RunStatus.COMPENSATED, failed.status
    for run in (done, failed):
        age(run, 40)
    before = {r.id: db_rows(r.id) for r in (done, failed)}
    assert before[failed.id]["compensation_item"] and before[failed.id]["effect"]

    report = archive_due()

    assert (report.runs, report.batches) == (2, 1)
    day = (timezone.now() - timedelta(days=40)).date()
    assert [Path(f).name for f in report.files] == [f"archive-{day.isoformat()}.jsonl.gz"]
    for run in (done, failed):
        assert from_archive(run.id) == before[run.id]
        assert not WorkflowRun.objects.filter(id=run.id).exists()
        assert not JournalEntry.objects.filter(run_id=run.id).exists()
        assert not EffectRecord.objects.filter(run_id=run.id).exists()
    assert not CompensationPlan.objects.exists() and not CompensationItem.objects.exists()
    assert report.journal_entries == sum(len(b["journal"]) for b in before.values())
    # zcat reads the whole day: every line of both runs
    lines = [json.loads(line) for line in gzip.open(archive_dir / Path(report.files[0]).name, "rt")]
    assert {line["run_id"] for line in lines} == {str(done.id), str(failed.id)}

"""Retention: finished runs past their age are written to a day's archive file, then deleted
through the one path the journal's trigger allows, one audit entry per batch; what is not due
stays; a failure between the file and the commit loses nothing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from ledger.models import EffectKeyIndex, EffectRecord
from operators.models import AuditEntry
from sagas import approve, get_run, start
from sagas.models import (
    ArchivedRun,
    CompensationItem,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from sagas.replay.engine import advance
from sagas.retention.archiving import archive_due, due_count, retention_for
from sagas.retention.store import FileStore, member_lines, run_lines, store_for_location
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


def test_it_leaves_young_unfinished_and_unsettled_runs_where_they_are(archive_dir):
    young = finish("ret_order", {"id": "young"})
    waiting = finish("ret_order", {"id": "waiting", "approve": True})
    unsettled = finish("ret_order", {"id": "unsettled"})
    age(young, 29)
    WorkflowRun.objects.filter(id=waiting.id).update(created_at=timezone.now() - timedelta(days=90))
    age(unsettled, 90)
    EffectRecord.objects.filter(run_id=unsettled.id).update(status="UNKNOWN")  # the reconciler still needs it

    assert due_count() == 0
    report = archive_due()

    assert (report.runs, report.batches, report.files) == (0, 0, [])
    assert WorkflowRun.objects.filter(id__in=[young.id, waiting.id, unsettled.id]).count() == 3
    assert not ArchivedRun.objects.exists() and not AuditEntry.objects.filter(action="runs.archived").exists()


def test_it_keeps_each_workflow_for_its_own_retention(archive_dir):
    short = finish("ret_short", {"n": 1})
    order = finish("ret_order", {"id": "o-8"})
    orphan = finish("ret_order", {"id": "o-orphan"})  # its workflow is no longer registered
    WorkflowRun.objects.filter(id=orphan.id).update(workflow_name="ret_removed")
    for run in (short, order):
        age(run, 8)
    age(orphan, 31)
    assert (retention_for("ret_short"), retention_for("ret_order"), retention_for("ret_removed")) == (
        timedelta(days=7), timedelta(days=30), timedelta(days=30))

    assert due_count() == 2
    report = archive_due()

    assert report.runs == 2
    assert set(ArchivedRun.objects.values_list("run_id", flat=True)) == {short.id, orphan.id}
    assert WorkflowRun.objects.filter(id=order.id).exists()
    assert due_count(older_than=timedelta(days=1)) == 1  # manage.py sagas_archive --older-than 1


def test_it_archives_in_bounded_batches_with_one_audit_entry_each(archive_dir):
    runs = [finish("ret_short", {"n": i}) for i in range(5)]
    for i, run in enumerate(runs):
        age(run, 10 + i)

    first = archive_due(batch_size=2, max_batches=1)
    assert (first.runs, first.batches) == (2, 1)
    assert WorkflowRun.objects.filter(id__in=[r.id for r in runs]).count() == 3
    rest = archive_due(batch_size=2)
    assert (rest.runs, rest.batches) == (3, 2)

    entries = list(AuditEntry.objects.filter(action="runs.archived").order_by("id"))
    assert [e.after["count"] for e in entries] == [2, 2, 1]
    assert [e.actor_label for e in entries] == ["system: retention"] * 3
    batches = {str(b) for b in ArchivedRun.objects.values_list("batch", flat=True)}
    assert {e.object_id for e in entries} == batches
    first_batch = set(ArchivedRun.objects.filter(batch=entries[0].object_id).values_list("run_id", flat=True))
    assert first_batch == {runs[4].id, runs[3].id}  # the oldest finishes first
    assert {entries[0].after["first_run_id"], entries[0].after["last_run_id"]} == {str(r) for r in first_batch}
    assert entries[0].tenant == "default"
    # a member holds one batch's runs of one day: each run is read from its own member, not the file
    assert len({a.location for a in ArchivedRun.objects.all()}) == 5  # aged 10 to 14 days: five days
    for archived in ArchivedRun.objects.all():
        store = store_for_location(archived.location)
        ids = {line["run_id"] for line in member_lines(store.read(archived.location, archived.offset, archived.length))}
        assert ids == {str(archived.run_id)}


def test_its_triggers_refuse_every_delete_but_the_archive_path(archive_dir):
    kept = finish("ret_short", {"n": 1})
    live = finish("ret_order", {"id": "live", "approve": True})
    entries = JournalEntry.objects.filter(run_id=kept.id).count()
    with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
        JournalEntry.objects.filter(run_id=kept.id).delete()
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused"), transaction.atomic():
        JournalEntry.objects.filter(run_id=kept.id).update(name="rewritten")
    with connection.cursor() as cur:
        # the function deletes nothing of a run that has no archive row, or is not finished
        ArchivedRun.objects.create(run_id=live.id, workflow_name="ret_order", version=1, tenant="default",
                                   status="WAITING", created_at=timezone.now(), archived_at=timezone.now(),
                                   location="file:///nowhere/archive-2026-01-01.jsonl.gz", offset=0, length=0,
                                   batch=live.id)
        cur.execute("SELECT runs, journal_entries FROM sagas_archive_delete(%s::uuid[])", [[str(kept.id), str(live.id)]])
        assert cur.fetchone() == (0, 0)
        # and leaves the door closed behind it: a DELETE later in the same transaction is refused
        with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
            cur.execute("SELECT * FROM sagas_archive_delete(%s::uuid[])", [[str(live.id)]])
            cur.execute("DELETE FROM sagas_journalentry WHERE run_id = %s", [str(kept.id)])
    assert JournalEntry.objects.filter(run_id=kept.id).count() == entries
    assert WorkflowRun.objects.filter(id__in=[kept.id, live.id]).count() == 2


def test_a_storage_failure_before_the_commit_loses_nothing(archive_dir, monkeypatch):
    runs = [finish("ret_short", {"n": i}) for i in range(3)]
    for run in runs:
        age(run, 10)
    real_pwrite = os.pwrite

    def disk_full(fd, data, offset):
        real_pwrite(fd, data[: len(data) // 2], offset)  # half of it went to disk, then the disk was full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sagas.retention.store.os.pwrite", disk_full)
    with pytest.raises(OSError, match="No space left"):
        archive_due()
    monkeypatch.undo()
    assert WorkflowRun.objects.filter(id__in=[r.id for r in runs]).count() == 3
    day_file = archive_dir / f"archive-{(timezone.now() - timedelta(days=10)).date().isoformat()}.jsonl.gz"
    assert day_file.stat().st_size == 0  # the half-written member was cut back off
    assert not ArchivedRun.objects.exists() and not AuditEntry.objects.filter(action="runs.archived").exists()

    class DatabaseGoneAfterTheFile(FileStore):
        def append(self, day, member):
            written = super().append(day, member)
            with connection.cursor() as cur:  # PostgreSQL goes away before the delete commits
                cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            return written

    with pytest.raises(DatabaseError):
        archive_due(writer=DatabaseGoneAfterTheFile(archive_dir.as_uri()))
    connection.close()
    assert WorkflowRun.objects.filter(id__in=[r.id for r in runs]).count() == 3
    before = {r.id: db_rows(r.id) for r in runs}

    report = archive_due()

    assert report.runs == 3
    for run in runs:
        assert from_archive(run.id) == before[run.id]  # one copy: the member ArchivedRun names
    path = archive_dir / Path(report.files[0]).name
    lines = [json.loads(line) for line in gzip.open(path, "rt")]  # the torn member was cut off
    runs_in_file = [line["run_id"] for line in lines if line["type"] == "run"]
    assert sorted(runs_in_file) == sorted([str(r.id) for r in runs] * 2)  # the failed batch's copy stays
    assert subprocess.run(["gzip", "-t", str(path)]).returncode == 0

    with open(path, "ab") as handle:  # a crash in the middle of the next write leaves a torn member
        handle.write(gzip.compress(b'{"type":"run"}\n' * 100)[:40])
    later = finish("ret_short", {"n": 9})
    age(later, 10)
    assert archive_due().runs == 1
    assert subprocess.run(["gzip", "-t", str(path)]).returncode == 0  # cut off before the new member
    assert from_archive(later.id)["run"][0]["id"] == str(later.id)


def test_a_repeated_effect_key_after_archiving_is_deduplicated_and_another_payload_refused(archive_dir):
    first = finish("ret_order", {"id": "o-9", "cents": 700})
    charge = first.result["charge"]
    age(first, 40)
    assert archive_due().runs == 1
    assert not EffectRecord.objects.filter(idempotency_key="charge-o-9").exists()
    kept = EffectKeyIndex.objects.get(idempotency_key="charge-o-9")
    assert (kept.status, kept.run_id) == ("SUCCEEDED", first.id)

    again = finish("ret_order", {"id": "o-9", "cents": 700})
    assert again.status == RunStatus.COMPLETED
    assert again.result["charge"] == charge  # the recorded outcome
    assert charges("charge-o-9") == 1  # the provider was not called a second time

    other = finish("ret_order", {"id": "o-9", "cents": 900})
    assert other.status != RunStatus.COMPLETED
    assert "already used" in json.dumps(get_run(other.id).error)
    assert charges("charge-o-9") == 1

    EffectKeyIndex.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    late = finish("ret_order", {"id": "o-9", "cents": 900})  # the key expired: it is free again
    assert late.status == RunStatus.COMPLETED and charges("charge-o-9") == 2


def test_the_command_counts_on_a_dry_run_and_archives_on_demand(archive_dir):
    from io import StringIO

    from django.core.management import call_command

    runs = [finish("ret_order", {"id": f"c-{i}"}) for i in range(2)]
    age(runs[0], 3)
    age(runs[1], 40)
    out = StringIO()
    call_command("sagas_archive", "--dry-run", stdout=out)
    assert out.getvalue().startswith("1 run(s) due for archiving")
    call_command("sagas_archive", "--dry-run", "--older-than", "2", stdout=out)
    assert "2 run(s) due" in out.getvalue()
    assert WorkflowRun.objects.count() == 2  # a dry run changes nothing

    out = StringIO()
    call_command("sagas_archive", "--older-than", "2", stdout=out)
    assert out.getvalue().startswith("archived 2 run(s)")
    assert "purged 0 expired effect key(s)" in out.getvalue()
    assert not WorkflowRun.objects.exists() and ArchivedRun.objects.count() == 2

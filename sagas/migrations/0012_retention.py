"""Retention: the archive index, and the one path the append-only triggers allow to delete.

* ``sagas_archivedrun``: where each archived run went (``sagas.models.ArchivedRun``).
* ``sagas_archive_delete(ids uuid[])``: deletes, of the given runs, only those that are
  terminal (COMPLETED, FAILED, CANCELLED, COMPENSATED) and have an archive row, with their
  journal, effect records, approvals and compensation plan (and items). It runs as its
  owner (``SECURITY DEFINER``, the role that migrates), so the runtime role, which holds no
  DELETE on the journal (``sagas.store.dbroles``), needs only EXECUTE on it. It sets the
  transaction-local setting ``saga_console.archive_delete`` around its journal DELETE, and
  resets it before returning.
* The journal's row trigger (``sagas_journal_append_only``, migration 0002) does not fire
  while that setting is on (a WHEN clause), so the function's DELETE goes through; every other
  UPDATE and DELETE is refused as before.
  (The trigger guards against mistakes, as core/append_only.py says: the owner could set the
  setting by hand, as it could drop the trigger. The runtime role cannot delete at all.)

Placeholder written first so that the hot-path and retention work can each own one
migration of a linear chain (0012 retention, 0013 hot path); filled in by the retention work.
"""

from django.db import migrations, models

ARCHIVE_GUC = "saga_console.archive_delete"
TERMINAL = "'COMPLETED', 'FAILED', 'CANCELLED', 'COMPENSATED'"

# The row trigger of migration 0002 (same name, same function: core/append_only.py), now with
# a WHEN clause: it is not fired while the archive setting is on. A WHEN clause is evaluated
# without calling the plpgsql function, so the archive path's DELETE pays no trigger call per
# row (it more than doubled the cost of deleting a journal row: 5.0 against 2.2 us).
TRIGGER_WITH_ARCHIVE_PATH = f"""
DROP TRIGGER sagas_journal_append_only ON sagas_journalentry;
CREATE TRIGGER sagas_journal_append_only
    BEFORE UPDATE OR DELETE ON sagas_journalentry
    FOR EACH ROW
    WHEN (current_setting('{ARCHIVE_GUC}', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION sagas_journal_append_only();
"""

TRIGGER_ORIGINAL = """
DROP TRIGGER sagas_journal_append_only ON sagas_journalentry;
CREATE TRIGGER sagas_journal_append_only
    BEFORE UPDATE OR DELETE ON sagas_journalentry
    FOR EACH ROW EXECUTE FUNCTION sagas_journal_append_only();
"""

ARCHIVE_DELETE = f"""
CREATE FUNCTION sagas_archive_delete(ids uuid[])
RETURNS TABLE (runs bigint, journal_entries bigint, effects bigint)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    due uuid[];
BEGIN
    SELECT coalesce(array_agg(r.id), '{{}}') INTO due
      FROM sagas_workflowrun r
     WHERE r.id = ANY(ids)
       AND r.status IN ({TERMINAL})
       AND EXISTS (SELECT 1 FROM sagas_archivedrun a WHERE a.run_id = r.id);
    journal_entries := 0; effects := 0; runs := 0;
    IF cardinality(due) = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    DELETE FROM sagas_compensationitem
     WHERE plan_id IN (SELECT p.id FROM sagas_compensationplan p WHERE p.run_id = ANY(due));
    DELETE FROM sagas_compensationplan WHERE run_id = ANY(due);
    DELETE FROM sagas_approvalrequest WHERE run_id = ANY(due);
    PERFORM set_config('{ARCHIVE_GUC}', 'on', true);
    DELETE FROM sagas_journalentry WHERE run_id = ANY(due);
    GET DIAGNOSTICS journal_entries = ROW_COUNT;
    PERFORM set_config('{ARCHIVE_GUC}', 'off', true);
    DELETE FROM ledger_effectrecord WHERE run_id = ANY(due);
    GET DIAGNOSTICS effects = ROW_COUNT;
    DELETE FROM sagas_workflowrun WHERE id = ANY(due);
    GET DIAGNOSTICS runs = ROW_COUNT;
    RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION sagas_archive_delete(uuid[]) FROM PUBLIC;

-- A SECURITY DEFINER function resolves names in the schema it was made in, never in one a
-- caller could put first on its search_path.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION sagas_archive_delete(uuid[]) SET search_path = %I, pg_temp', current_schema());
END;
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("sagas", "0011_continue_as_new"), ("ledger", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="ArchivedRun",
            fields=[
                ("run_id", models.UUIDField(primary_key=True, serialize=False)),
                ("workflow_name", models.CharField(max_length=200)),
                ("version", models.PositiveIntegerField()),
                ("tenant", models.CharField(max_length=100)),
                ("business_key", models.CharField(blank=True, default="", max_length=200)),
                ("status", models.CharField(choices=[("PENDING", "Pending"), ("RUNNING", "Running"), ("WAITING", "Waiting"), ("NEEDS_ATTENTION", "Needs Attention"), ("COMPENSATING", "Compensating"), ("COMPENSATED", "Compensated"), ("COMPLETED", "Completed"), ("FAILED", "Failed"), ("CANCELLED", "Cancelled")], max_length=20)),
                ("created_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("archived_at", models.DateTimeField()),
                ("location", models.CharField(help_text="the archive file's URL", max_length=1000)),
                ("offset", models.BigIntegerField(help_text="where the run's gzip member starts in the file")),
                ("length", models.BigIntegerField(help_text="the member's length in bytes")),
                ("batch", models.UUIDField(help_text="the archive batch (one audit entry each)")),
            ],
            options={
                "indexes": [models.Index(fields=["-archived_at"], name="archived_run_recent")],
            },
        ),
        migrations.RunSQL(TRIGGER_WITH_ARCHIVE_PATH, TRIGGER_ORIGINAL),
        migrations.RunSQL(ARCHIVE_DELETE, "DROP FUNCTION IF EXISTS sagas_archive_delete(uuid[]);"),
    ]

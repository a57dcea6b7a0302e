"""The journal's foreign key to its run becomes a delete guard on the run.

A pure step is one statement: the run row's fenced UPDATE and the journal INSERT. The foreign
key added a check to every one of them (at commit, being deferrable: a query on the run's
primary key taking a KEY SHARE lock on its row): 225-257 µs of wall time against 199-204 µs
without it, for the fenced INSERT alone (measured 2026-12-02; bench/README.md has the figures).
What it guarded holds without it:

* an entry cannot name a run that does not exist: every INSERT of an entry selects the run's
  row in the same statement (``sagas.store.systemdb``'s fenced statements and ``append_event``,
  ``sagas.store.startdb``) or in the same transaction with the row locked (the services);
* a run cannot be deleted while it has entries: ``sagas_run_delete_guard`` refuses it, with
  the error code a foreign key gives (23503). Retention deletes the journal first
  (``sagas_archive_delete``), so its path is unchanged; the ORM's ``PROTECT`` still stops
  ``run.delete()`` before any SQL.

TRUNCATE does not fire row triggers: ``manage.py flush`` and the test harness empty every
table in one statement, as before.
"""

from django.db import migrations, models

GUARD = """
CREATE FUNCTION sagas_run_delete_guard() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sagas_journalentry WHERE run_id = OLD.id) THEN
        RAISE EXCEPTION 'run % still has journal entries: it can be deleted only after them (retention archives both)',
            OLD.id USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER sagas_run_delete_guard
    BEFORE DELETE ON sagas_workflowrun
    FOR EACH ROW EXECUTE FUNCTION sagas_run_delete_guard();
"""

NO_GUARD = """
DROP TRIGGER IF EXISTS sagas_run_delete_guard ON sagas_workflowrun;
DROP FUNCTION IF EXISTS sagas_run_delete_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("sagas", "0013_hot_path")]

    operations = [
        migrations.RunSQL(GUARD, NO_GUARD),
        migrations.AlterField(
            model_name="journalentry",
            name="run",
            field=models.ForeignKey(
                db_constraint=False, db_index=False, on_delete=models.PROTECT, related_name="journal",
                to="sagas.workflowrun",
            ),
        ),
    ]

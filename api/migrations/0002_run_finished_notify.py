"""A run's status change is announced on PostgreSQL channel ``saga_run_status`` as ``"<id>:<status>"``,
so ``GET /runs/{id}?wait=`` (api/waiting.py) wakes on the commit instead of polling. NOTIFY is
transactional: listeners hear it only once the status change commits, and never for a rollback."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION saga_run_status_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('saga_run_status', NEW.id::text || ':' || NEW.status);
    RETURN NULL;
END
$$;
CREATE TRIGGER saga_run_status_notify
    AFTER UPDATE OF status ON sagas_workflowrun
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION saga_run_status_notify();
"""
REVERSE = """
DROP TRIGGER IF EXISTS saga_run_status_notify ON sagas_workflowrun;
DROP FUNCTION IF EXISTS saga_run_status_notify();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0001_initial"),
        ("sagas", "0010_run_summary_business_key_trigram"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]

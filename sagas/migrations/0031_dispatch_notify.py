"""A run inserted or updated to PENDING is announced on channel ``sagas_dispatch`` as
``"<id> <definition hash, 16 characters> <priority>"`` (``sagas.runtime.dispatch``): a worker
with that code and a free thread takes it on the commit instead of after RQ's round trips.
NOTIFY is transactional (heard only once the change commits, never for a rollback) and
best-effort for us: RQ and the sweeper still wake every run."""

from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION sagas_dispatch_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sagas_dispatch', NEW.id::text || ' ' || left(NEW.definition_hash, 16) || ' '
                                        || NEW.priority::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER sagas_dispatch_notify_insert
    AFTER INSERT ON sagas_workflowrun
    FOR EACH ROW WHEN (NEW.status = 'PENDING')
    EXECUTE FUNCTION sagas_dispatch_notify();
CREATE TRIGGER sagas_dispatch_notify_update
    AFTER UPDATE OF status ON sagas_workflowrun
    FOR EACH ROW WHEN (NEW.status = 'PENDING' AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION sagas_dispatch_notify();
"""
REVERSE = """
DROP TRIGGER IF EXISTS sagas_dispatch_notify_insert ON sagas_workflowrun;
DROP TRIGGER IF EXISTS sagas_dispatch_notify_update ON sagas_workflowrun;
DROP FUNCTION IF EXISTS sagas_dispatch_notify();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("sagas", "0030_run_priority"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]

"""Make a table append-only in PostgreSQL, for migrations: a trigger refuses UPDATE and DELETE.

Used by the journal (sagas) and the audit log (console). The refusal holds for every
client, the admin and ad-hoc SQL included; only a superuser who drops the trigger
can change history, and that leaves its own trace in the migration state.
Do not change the SQL of an existing name: migrations that ran already used it.
"""

from __future__ import annotations

from django.db import migrations


def append_only(table: str, name: str) -> migrations.RunSQL:
    """A reversible ``RunSQL`` creating function and trigger ``name`` on ``table``."""
    forward = f"""
CREATE FUNCTION {name}() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '{table} is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER {name}
    BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {name}();
"""
    backward = f"""
DROP TRIGGER IF EXISTS {name} ON {table};
DROP FUNCTION IF EXISTS {name}();
"""
    return migrations.RunSQL(forward, backward)

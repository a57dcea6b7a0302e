"""Make a table append-only in PostgreSQL, for migrations: triggers refuse UPDATE, DELETE and TRUNCATE.

Used by the journal (sagas) and the audit log (console). The refusal holds for every
client, the admin, ad-hoc SQL and ``manage.py flush`` included. The triggers guard
against mistakes, not against the tables' owner, who can drop or disable them: the
real protection is that the processes connect as a runtime role that owns nothing and
holds no UPDATE, DELETE or TRUNCATE on these tables (``manage.py db_roles``, README
"Least-privilege database role").
Do not change the SQL of an existing name: migrations that ran already used it.
"""

from __future__ import annotations

from django.db import migrations

# The test harness's escape hatch, and only its: pytest-django empties the tables between
# transactional tests with TRUNCATE, so config/settings_test.py sets this on its connections
# (``-c saga_console.allow_truncate=on``). Production settings never do. Anyone who may
# TRUNCATE may also SET it, which is why the runtime role must hold no TRUNCATE at all.
TRUNCATE_ESCAPE_GUC = "saga_console.allow_truncate"


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


def no_truncate(table: str, name: str) -> migrations.RunSQL:
    """A reversible ``RunSQL`` creating function and statement-level trigger ``name`` that
    refuses TRUNCATE of ``table`` (row triggers do not fire on TRUNCATE), unless the session
    set ``TRUNCATE_ESCAPE_GUC`` to ``on`` (the test harness only)."""
    forward = f"""
CREATE FUNCTION {name}() RETURNS trigger AS $$
BEGIN
    IF current_setting('{TRUNCATE_ESCAPE_GUC}', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '{table} is append-only: TRUNCATE refused'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER {name}
    BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {name}();
"""
    backward = f"""
DROP TRIGGER IF EXISTS {name} ON {table};
DROP FUNCTION IF EXISTS {name}();
"""
    return migrations.RunSQL(forward, backward)

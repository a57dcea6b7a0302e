from __future__ import annotations

from django.db import migrations

FORWARD = """
CREATE FUNCTION sagas_journal_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'sagas_journalentry is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER sagas_journal_append_only
    BEFORE UPDATE OR DELETE ON sagas_journalentry
    FOR EACH ROW EXECUTE FUNCTION sagas_journal_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS sagas_journal_append_only ON sagas_journalentry;
DROP FUNCTION IF EXISTS sagas_journal_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("sagas", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]

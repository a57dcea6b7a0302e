"""The open effects' connectors in an index of their own, so the ambiguous-effects queue lists
the connectors for its filter with one index probe per connector (a loose index scan,
``operators.selectors.queues.effect_connectors``) instead of sorting every open effect: at
10,000,000 runs, 20,000 open effects nearly all of one connector (5 to 10 ms, then 0.05).

Only that walk may use the index. With a plain partial index (``WHERE status IN ('UNKNOWN',
'IN_PROGRESS')``) the planner also read it for the queue's count and its connector filter,
whose conditions imply that predicate, and then fetched every matching row from the table (a
page of 50 sorted from all 20,000 matches: 12 ms, against 0.05 ms in intent order through
effect_open_context). So its key and its predicate are in the "C" collation, which only the walk
asks for; a predicate in another collation is one Django's ``Index`` cannot state, hence SQL,
with the model's state left as it is. Built ``CONCURRENTLY`` (hence ``atomic = False``): the
ledger is written while it builds."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0004_effect_run_context"),
    ]

    operations = [
        migrations.RunSQL(
            sql="""CREATE INDEX CONCURRENTLY IF NOT EXISTS effect_open_connector
                   ON ledger_effectrecord ((connector COLLATE "C"))
                   WHERE status COLLATE "C" IN ('UNKNOWN', 'IN_PROGRESS')""",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS effect_open_connector",
        ),
    ]

"""The calls out right now per connector and flow key, what a concurrency limit counts
(``ledger.flow.gate``): a partial index of IN_PROGRESS effects, which are few whatever the
size of the ledger. And each connector's calls by the time they ended, for the connectors
page's latency and error rate over the last minutes (``ledger.flow.selectors``): partial, on the
ended calls only, so the open effects' queue (whose rows have no ``completed_at``) cannot pick it
for its connector filter instead of effect_open_context. Built ``CONCURRENTLY`` (hence ``atomic = False``): the ledger is written
while it builds."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0006_flow_control"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="effectrecord",
                    index=models.Index(fields=["connector", "completed_at"], condition=models.Q(
                        ("completed_at__isnull", False)), name="effect_completed"),
                ),
                migrations.AddIndex(
                    model_name="effectrecord",
                    index=models.Index(condition=models.Q(("status", "IN_PROGRESS")),
                                       fields=["connector", "flow_key", "dispatched_at"], name="effect_in_flight"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql="""CREATE INDEX CONCURRENTLY IF NOT EXISTS effect_completed
                           ON ledger_effectrecord (connector, completed_at)
                           WHERE completed_at IS NOT NULL""",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS effect_completed",
                ),
                migrations.RunSQL(
                    sql="""CREATE INDEX CONCURRENTLY IF NOT EXISTS effect_in_flight
                           ON ledger_effectrecord (connector, flow_key, dispatched_at)
                           WHERE status = 'IN_PROGRESS'""",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS effect_in_flight",
                ),
            ],
        ),
    ]

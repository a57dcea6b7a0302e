"""A run's priority (``sagas.runtime.queue``: 1 is taken first, 5 last, 3 by default). The column
has a constant default, so adding it rewrites nothing; its check is added NOT VALID and then
validated, which scans the table without blocking writes (every existing row holds the default)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0029_run_business_key_grams"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="priority",
            field=models.PositiveSmallIntegerField(db_default=3, default=3),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="workflowrun",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("priority__gte", 1), ("priority__lte", 5)), name="run_priority_valid"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=["""ALTER TABLE sagas_workflowrun ADD CONSTRAINT run_priority_valid
                            CHECK (priority >= 1 AND priority <= 5) NOT VALID""",
                         "ALTER TABLE sagas_workflowrun VALIDATE CONSTRAINT run_priority_valid"],
                    reverse_sql="ALTER TABLE sagas_workflowrun DROP CONSTRAINT IF EXISTS run_priority_valid",
                ),
            ],
        ),
    ]

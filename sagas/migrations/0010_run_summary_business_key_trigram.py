"""A run's summary (``WorkflowRun.summary``: what its workflow declares a person needs to know,
see sagas.summaries), and a trigram index on ``business_key`` so the console finds runs by any
part of their key (``ILIKE '%0012%'``), not only its start.

The ``pg_trgm`` extension is created if missing (a trusted extension since PostgreSQL 13: the
database's owner may create it). The index is built ``CONCURRENTLY`` (hence ``atomic =
False``) so that adding it to a live table does not block the engine's writes; the column has
no default, so adding it rewrites nothing.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently, TrigramExtension
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sagas", "0009_journal_no_truncate")]

    operations = [
        TrigramExtension(),
        migrations.AddField(
            model_name="workflowrun",
            name="summary",
            field=models.JSONField(
                blank=True, null=True,
                help_text="what its workflow declares a person needs to know (sagas.summaries), from the input at start",
            ),
        ),
        AddIndexConcurrently(
            model_name="workflowrun",
            index=GinIndex(fields=["business_key"], opclasses=["gin_trgm_ops"], name="run_business_key_trgm"),
        ),
    ]

"""The top-level runs alone (no parent: ``parent_run`` is null), newest first, for the runs
list's "top-level runs only" filter (console and HTTP API): a partial index in the list's
keyset order, so a page of top-level runs is a page of index entries however many child runs
(sagas.children) were created since. Built ``CONCURRENTLY`` (hence ``atomic = False``): it
covers most of the table."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0034_children"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(condition=models.Q(parent_run__isnull=True), fields=["-created_at", "-id"],
                               name="run_top_level"),
        ),
    ]

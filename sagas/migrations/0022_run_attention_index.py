"""The partial index of runs that need a person or failed, by reason and age (``WorkflowRun.Meta``:
``run_attention``): the overview's oldest item per reason is one probe. Built ``CONCURRENTLY``
(hence ``atomic = False``) so that adding it to a live table of runs does not block the engine."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0021_run_counts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["status", "status_reason", "updated_at"],
                               condition=models.Q(status__in=["NEEDS_ATTENTION", "FAILED"]), name="run_attention"),
        ),
    ]

"""The partial index of re-runs by the run they were re-run from (``WorkflowRun.Meta``:
``run_forked_from``): the run page lists a run's re-runs, and a re-run from a step checks the
earlier ones, on a table of millions of runs of which few are re-runs. Built ``CONCURRENTLY``
(hence ``atomic = False``) so that adding it does not block the engine's writes."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0018_run_forks"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["forked_from"], condition=models.Q(forked_from__isnull=False),
                               name="run_forked_from"),
        ),
    ]

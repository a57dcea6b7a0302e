"""The partial index of paused runs (``WorkflowRun.Meta``: ``run_paused``), built
``CONCURRENTLY`` (hence ``atomic = False``) so that adding it to a live table of runs does not
block the engine's writes. Paused runs are few: the index stays small."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0016_pause"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["-paused_at"], condition=models.Q(paused_at__isnull=False), name="run_paused"),
        ),
    ]

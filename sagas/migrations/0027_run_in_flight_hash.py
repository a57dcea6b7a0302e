"""Each version's oldest run in flight, for the workers page's stranded versions: a partial
index of the runs in flight by (definition hash, creation), built ``CONCURRENTLY`` (hence
``atomic = False``)."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0026_in_flight_counts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(condition=models.Q(status__in=["PENDING", "RUNNING", "WAITING", "NEEDS_ATTENTION"]),
                               fields=["definition_hash", "created_at"], name="run_in_flight_hash"),
        ),
    ]

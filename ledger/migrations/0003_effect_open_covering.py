"""The open effects' partial index carries what the queue and the overview read (status, last
dispatch, run, tenant, connector), so counting the open effects and finding the oldest read
the index alone, not each open effect's row. Built ``CONCURRENTLY`` before the narrower index
it replaces is dropped (hence ``atomic = False``): writers are never blocked and the queue
always has one of the two."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0002_effect_key_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="effectrecord",
            index=models.Index(fields=["intent_at", "id"],
                               include=["status", "dispatched_at", "run_id", "tenant", "connector"],
                               condition=models.Q(status__in=["UNKNOWN", "IN_PROGRESS"]),
                               name="effect_open_covering"),
        ),
        RemoveIndexConcurrently(model_name="effectrecord", name="effect_open"),
    ]

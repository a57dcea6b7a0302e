"""Each effect record carries its run's workflow and business key (``workflow_name``,
``business_key``), and the open effects' partial index carries them too, so the
ambiguous-effects queue filters by workflow and searches business keys on the open effects
alone: at 10,000,000 runs those filters looked up the run of each of 20,000 open effects (66 to
102 ms). The columns are added with a constant default (no table rewrite); the sagas app fills
them from the runs and keeps them (sagas migration 0028). The new index is built
``CONCURRENTLY`` before the one it replaces is dropped (hence ``atomic = False``)."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0003_effect_open_covering"),
    ]

    operations = [
        migrations.AddField(
            model_name="effectrecord",
            name="workflow_name",
            field=models.CharField(blank=True, db_default="", default="", editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name="effectrecord",
            name="business_key",
            field=models.CharField(blank=True, db_default="", default="", editable=False, max_length=200),
        ),
        AddIndexConcurrently(
            model_name="effectrecord",
            index=models.Index(fields=["intent_at", "id"],
                               include=["status", "dispatched_at", "run_id", "tenant", "connector", "workflow_name",
                                        "business_key"],
                               condition=models.Q(status__in=["UNKNOWN", "IN_PROGRESS"]),
                               name="effect_open_context"),
        ),
        RemoveIndexConcurrently(model_name="effectrecord", name="effect_open_covering"),
    ]

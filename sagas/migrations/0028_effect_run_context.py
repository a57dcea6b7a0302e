"""Effect records get their run's workflow and business key from a trigger on insert, and the
unsettled ones already there are filled from their runs (``sagas.store.effect_context``)."""

from __future__ import annotations

from django.db import migrations

from sagas.store import effect_context


class Migration(migrations.Migration):
    dependencies = [
        ("sagas", "0027_run_in_flight_hash"),
        ("ledger", "0004_effect_run_context"),
    ]

    operations = [
        migrations.RunSQL(effect_context.INSTALL, effect_context.UNINSTALL),
    ]

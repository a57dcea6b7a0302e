"""The partial index of a run's repairs in the journal (``JournalEntry.Meta``:
``journal_repairs``): the run page lists them without reading the run's whole history. Built
``CONCURRENTLY`` (hence ``atomic = False``) so that adding it to a journal of millions of
entries does not block the engine's appends; only the few repair entries are in it."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0019_run_forked_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="journalentry",
            index=models.Index(fields=["run", "-seq"],
                               condition=models.Q(kind__in=("moved", "redriven", "forked", "operator_action")),
                               name="journal_repairs"),
        ),
    ]

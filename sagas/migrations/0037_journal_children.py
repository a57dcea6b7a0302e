"""A parent's journal entry for one child run (``child_started``, ``child_finished``), found by
the call's name (``JournalEntry.Meta``: ``journal_children``) when a child ends, without reading
a fan-out's long journal. Built ``CONCURRENTLY`` (hence ``atomic = False``) so that adding it to a
journal of millions of entries does not block the engine's appends; only children's entries are in it."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0036_children_in_flight"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="journalentry",
            index=models.Index(condition=models.Q(kind__in=["child_started", "child_finished"]),
                               fields=["run", "name"], name="journal_children"),
        ),
    ]

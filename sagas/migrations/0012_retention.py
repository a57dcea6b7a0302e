"""Retention: the archive index, and the one path the append-only triggers allow to delete.

Placeholder written first so that the hot-path and retention work can each own one
migration of a linear chain (0012 retention, 0013 hot path); filled in by the retention work.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("sagas", "0011_continue_as_new")]

    operations: list = []

"""The dispatch and step hot path: indexes on the run row (placeholder, filled in by that work)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("sagas", "0012_retention")]

    operations: list = []

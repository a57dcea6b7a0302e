from __future__ import annotations

from django.db import migrations

from core.append_only import append_only


class Migration(migrations.Migration):
    dependencies = [("sagas", "0001_initial")]

    operations = [append_only("sagas_journalentry", "sagas_journal_append_only")]

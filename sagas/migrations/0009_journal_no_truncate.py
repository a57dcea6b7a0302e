from __future__ import annotations

from django.db import migrations

from core.append_only import no_truncate


class Migration(migrations.Migration):
    dependencies = [("sagas", "0008_approval_indexes")]

    operations = [no_truncate("sagas_journalentry", "sagas_journal_no_truncate")]

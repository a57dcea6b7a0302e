from __future__ import annotations

from django.db import migrations

from core.append_only import no_truncate


class Migration(migrations.Migration):
    dependencies = [("console", "0002_roles_and_append_only")]

    operations = [no_truncate("console_auditentry", "console_audit_no_truncate")]

"""Tenant scoping: the users' tenant limits, and the tenant of each audit entry's object.

The backfill fills only the new column of the entries already written (who did what is
untouched), so the row trigger that keeps the table append-only is set aside for those
statements, inside this migration's transaction, by the tables' owner that runs migrations.
"""

from __future__ import annotations

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

BACKFILL = """
ALTER TABLE console_auditentry DISABLE TRIGGER console_audit_append_only;
UPDATE console_auditentry a SET tenant = r.tenant FROM sagas_workflowrun r
 WHERE a.object_type = 'run' AND a.object_id = r.id::text;
UPDATE console_auditentry a SET tenant = e.tenant FROM ledger_effectrecord e
 WHERE a.object_type = 'effect' AND a.object_id = e.id::text;
UPDATE console_auditentry a SET tenant = r.tenant FROM sagas_approvalrequest p
  JOIN sagas_workflowrun r ON r.id = p.run_id
 WHERE a.object_type = 'approval' AND a.object_id = p.id::text;
ALTER TABLE console_auditentry ENABLE TRIGGER console_audit_append_only;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('console', '0003_audit_no_truncate'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ('sagas', '0004_approvals_compensation'),
        ('ledger', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='TenantScope',
            fields=[
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='tenant_scope', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('tenants', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=100), blank=True, default=list, help_text="Comma-separated. The user sees only these tenants' runs, effects, approvals and audit entries; empty: none. Delete this limit to let them see every tenant.", size=None)),
            ],
            options={
                'verbose_name': 'tenant limit',
            },
        ),
        migrations.AddField(
            model_name='auditentry',
            name='tenant',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddIndex(
            model_name='auditentry',
            index=models.Index(fields=['tenant', '-created_at', '-id'], name='audit_tenant_keyset'),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]

"""The audit log and tenant limits move to the ``operators`` app, which the console and the HTTP
API both use. Only Django's model state moves: the tables keep their names, rows, append-only
trigger and grants (``operators/migrations/0001_initial.py`` takes them over)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0006_bulk_batches'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(model_name='tenantscope', name='user'),
                migrations.DeleteModel(name='AuditEntry'),
                migrations.DeleteModel(name='TenantScope'),
            ],
            database_operations=[],
        ),
    ]

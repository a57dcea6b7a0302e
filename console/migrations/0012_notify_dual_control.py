"""Notifications: the kind dual_control (a dangerous action waiting for a second person)."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0011_sso_identity'),
    ]

    operations = [
        migrations.AlterField(
            model_name='notificationdelivery',
            name='kind',
            field=models.CharField(choices=[('unknown_effect', 'UNKNOWN effect'), ('approval_waiting', 'approval waiting'), ('compensation_failed', 'failed compensation'), ('version_mismatch', 'version mismatch (stranded run)'), ('run_failed', 'FAILED run'), ('circuit_opened', 'connector circuit opened'), ('circuit_closed', 'connector circuit closed'), ('dual_control', 'dangerous action waiting for a second person')], max_length=30),
        ),
        migrations.AlterField(
            model_name='notificationendpoint',
            name='kinds',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(choices=[('unknown_effect', 'UNKNOWN effect'), ('approval_waiting', 'approval waiting'), ('compensation_failed', 'failed compensation'), ('version_mismatch', 'version mismatch (stranded run)'), ('run_failed', 'FAILED run'), ('circuit_opened', 'connector circuit opened'), ('circuit_closed', 'connector circuit closed'), ('dual_control', 'dangerous action waiting for a second person')], max_length=30), blank=True, default=list, size=None),
        ),
    ]

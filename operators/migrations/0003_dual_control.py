"""Dual control: a dangerous action asked for by one person waits for a second one
(``operators.services.dual``)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('operators', '0002_audit_object_id_longer'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='DualControlRequest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(max_length=60)),
                ('policy', models.CharField(max_length=60)),
                ('act', models.CharField(max_length=60)),
                ('params', models.JSONField()),
                ('object_type', models.CharField(max_length=60)),
                ('object_id', models.CharField(max_length=400)),
                ('tenant', models.CharField(blank=True, default='', max_length=100)),
                ('summary', models.CharField(max_length=300)),
                ('seen', models.JSONField(blank=True, null=True)),
                ('requested_by_label', models.CharField(max_length=200)),
                ('reason', models.TextField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('deadline', models.DateTimeField()),
                ('state', models.CharField(choices=[('PENDING', 'waiting for a second person'), ('CONFIRMED', 'confirmed and done'), ('FAILED', 'confirmed, but the action was refused'), ('REFUSED', 'refused by the second person'), ('WITHDRAWN', 'withdrawn by the requester'), ('EXPIRED', 'not confirmed before its deadline')], default='PENDING', max_length=12)),
                ('decided_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('decision_reason', models.TextField(blank=True, default='')),
                ('result', models.TextField(blank=True, default='')),
                ('decided_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('requested_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('state', 'PENDING')), fields=['deadline', 'id'], name='dual_pending'), models.Index(fields=['object_type', 'object_id'], name='dual_object')],
            },
        ),
    ]

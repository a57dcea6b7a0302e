"""The audit log and tenant limits, taken over from the ``console`` app
(``console/migrations/0007_audit_and_tenants_to_operators.py``): the tables exist already, under
their console names, so only Django's model state is created here. The content types move with
them, so the permissions already granted on these models keep holding."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("auditentry", "tenantscope")


def move_content_types(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label="console", model__in=MODELS).update(app_label="operators")


def move_content_types_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label="operators", model__in=MODELS).update(app_label="console")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('console', '0007_audit_and_tenants_to_operators'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('auth', '0012_alter_user_first_name_max_length'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(database_operations=[], state_operations=[
        migrations.CreateModel(
            name='TenantScope',
            fields=[
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='tenant_scope', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('tenants', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=100), blank=True, default=list, help_text="Comma-separated. The user sees only these tenants' runs, effects, approvals and audit entries; empty: none. Delete this limit to let them see every tenant.", size=None)),
            ],
            options={
                'verbose_name': 'tenant limit',
                'db_table': 'console_tenantscope',
            },
        ),
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('actor_label', models.CharField(max_length=200)),
                ('action', models.CharField(max_length=60)),
                ('object_type', models.CharField(max_length=60)),
                ('object_id', models.CharField(max_length=100)),
                ('before', models.JSONField(blank=True, null=True)),
                ('after', models.JSONField(blank=True, null=True)),
                ('reason', models.TextField(blank=True, default='')),
                ('ip', models.GenericIPAddressField(blank=True, null=True)),
                ('outcome', models.CharField(choices=[('ok', 'done'), ('denied', 'denied (role)'), ('refused', 'refused (state)')], max_length=10)),
                ('message', models.TextField(blank=True, default='')),
                ('tenant', models.CharField(blank=True, default='', max_length=100)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('actor', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name_plural': 'audit entries',
                'db_table': 'console_auditentry',
                'ordering': ['-created_at', '-id'],
                'indexes': [models.Index(fields=['actor_label', '-created_at'], name='audit_actor'), models.Index(fields=['action', '-created_at'], name='audit_action'), models.Index(fields=['object_type', 'object_id'], name='audit_object'), models.Index(fields=['-created_at', '-id'], name='audit_keyset'), models.Index(fields=['tenant', '-created_at', '-id'], name='audit_tenant_keyset')],
            },
        ),
        ]),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]

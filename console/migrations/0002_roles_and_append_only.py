from __future__ import annotations

from django.db import migrations

from core.append_only import append_only

ROLES = ("viewer", "operator", "approver")


def create_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [("console", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]

    operations = [
        migrations.RunPython(create_roles, remove_roles),
        append_only("console_auditentry", "console_audit_append_only"),
    ]

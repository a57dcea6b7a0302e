from __future__ import annotations

from django.db import migrations

ROLES = ("viewer", "operator", "approver")

FORWARD = """
CREATE FUNCTION console_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'console_auditentry is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER console_audit_append_only
    BEFORE UPDATE OR DELETE ON console_auditentry
    FOR EACH ROW EXECUTE FUNCTION console_audit_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS console_audit_append_only ON console_auditentry;
DROP FUNCTION IF EXISTS console_audit_append_only();
"""


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
        migrations.RunSQL(FORWARD, BACKWARD),
    ]

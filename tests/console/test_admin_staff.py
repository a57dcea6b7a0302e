"""``createuser --staff`` opens the Django admin read-only, and the demo's auditor is such a user:
they can open every changelist and change nothing."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from demo.management.commands.demo import USERS, ensure_demo_users
from operators.models import AuditEntry
from operators.roles import APPROVER, OPERATOR, VIEWER

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-pass-42"
CHANGELISTS = ("/admin/auth/user/", "/admin/auth/group/", "/admin/sagas/workflowrun/", "/admin/sagas/journalentry/",
               "/admin/sagas/approvalrequest/", "/admin/ledger/effectrecord/", "/admin/operators/auditentry/",
               "/admin/operators/tenantscope/", "/admin/demo/providerfault/")


def every_model_permission(verb: str) -> list[str]:
    """``<app>.<verb>_<model>`` of every model that has default permissions (django-rq's dashboard
    is a placeholder model with none)."""
    return [f"{m._meta.app_label}.{verb}_{m._meta.model_name}" for m in apps.get_models()
            if verb in m._meta.default_permissions]


def test_it_makes_a_staff_user_who_reads_the_admin_and_changes_nothing(people):
    out = io.StringIO()
    call_command("createuser", "audra", role=[VIEWER], password=PASSWORD, staff=True, stdout=out)
    assert "staff (read-only admin)" in out.getvalue()
    audra = get_user_model().objects.get(username="audra")
    assert audra.is_staff and not audra.is_superuser
    for verb in ("add", "change", "delete"):
        assert [p for p in every_model_permission(verb) if audra.has_perm(p)] == [], verb
    assert all(audra.has_perm(p) for p in every_model_permission("view"))

    client = Client()
    client.force_login(audra)
    for url in CHANGELISTS:
        assert client.get(url).status_code == 200, url
    other = people["operator"]
    page = client.get(f"/admin/auth/user/{other.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.post(f"/admin/auth/user/{other.pk}/change/", {"username": "renamed", "is_superuser": "on"}
                       ).status_code == 403
    assert client.get("/admin/auth/user/add/").status_code == 403
    assert client.post(f"/admin/auth/user/{other.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post("/admin/auth/group/add/", {"name": "admins"}).status_code == 403
    other.refresh_from_db()
    assert other.username == "olga" and not other.is_superuser


def test_it_leaves_a_user_without_staff_out_of_the_admin_and_audits_the_grant_as_createuser():
    call_command("createuser", "otto", role=[OPERATOR], password=PASSWORD, stdout=io.StringIO())
    otto = get_user_model().objects.get(username="otto")
    client = Client()
    client.force_login(otto)
    assert not otto.is_staff and client.get("/admin/").status_code == 302  # to the admin's login

    call_command("createuser", "otto", role=[OPERATOR], password=PASSWORD, staff=True, stdout=io.StringIO())
    otto.refresh_from_db()
    client.force_login(otto)  # createuser set the password again: the old session has ended
    assert otto.is_staff and client.get("/admin/sagas/workflowrun/").status_code == 200
    entry = AuditEntry.objects.filter(action="user.roles", object_id=str(otto.pk)).latest("id")
    assert entry.actor_label == "system: createuser" and "is_staff on" in entry.message
    # Updating without --staff leaves it as it is; --no-staff takes it away.
    call_command("createuser", "otto", "--role", OPERATOR, "--role", APPROVER, password=PASSWORD, stdout=io.StringIO())
    otto.refresh_from_db()
    assert otto.is_staff
    call_command("createuser", "otto", role=[OPERATOR], password=PASSWORD, staff=False, stdout=io.StringIO())
    otto.refresh_from_db()
    assert not otto.is_staff and not otto.user_permissions.exists()


def test_it_makes_the_demos_auditor_a_read_only_staff_user_and_nobody_else(tmp_path):
    users = ensure_demo_users(tmp_path / "demo-users.txt")
    assert [u for u, _, _ in users] == [u for u, _, _ in USERS] == ["operator", "approver", "auditor"]
    assert ensure_demo_users(tmp_path / "demo-users.txt") == users  # a restarted demo prints the same
    staff = {u.username: u.is_staff for u in get_user_model().objects.filter(username__in=["operator", "approver",
                                                                                            "auditor"])}
    assert staff == {"operator": False, "approver": False, "auditor": True}
    auditor = get_user_model().objects.get(username="auditor")
    assert auditor.check_password(dict((u, p) for u, _, p in users)["auditor"])
    client = Client()
    client.force_login(auditor)
    for url in CHANGELISTS:
        assert client.get(url).status_code == 200, url
    assert not any(auditor.has_perm(p) for p in every_model_permission("change"))

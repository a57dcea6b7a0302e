"""Who may do what is audited wherever it changes: a role granted in the Django admin is one
audit entry naming the admin who granted it, on the console's audit page; changes made from a
shell or by createuser are audited as "system"; tenant limits are part of a user's roles."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse

from console.user_audit import ACTION
from operators.models import AuditEntry, TenantScope
from operators.roles import OPERATOR, VIEWER, ensure_groups
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def vera() -> User:
    ensure_groups()
    user = User.objects.create_user("vera2", password="pw-vera2-long-enough")
    user.groups.add(Group.objects.get(name=VIEWER))
    return user


def _entries(user: User) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=ACTION, object_type="user", object_id=str(user.pk)).order_by("id"))


def _change_form(admin_client, user: User) -> dict[str, object]:
    """What the admin's change form of ``user`` posts when saved unchanged (the inline's
    management form as the page renders it)."""
    page = admin_client.get(reverse("admin:auth_user_change", args=[user.pk]))
    assert page.status_code == 200
    data: dict[str, object] = {
        "username": user.username, "first_name": "", "last_name": "", "email": "",
        "is_active": "on", "groups": list(user.groups.values_list("pk", flat=True)),
        "date_joined_0": f"{user.date_joined:%Y-%m-%d}", "date_joined_1": f"{user.date_joined:%H:%M:%S}",
        "last_login_0": "", "last_login_1": "",
    }
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        data.update({f"{management.prefix}-{name}": value for name, value in management.initial.items()})
    return data


def test_it_audits_a_role_granted_in_the_admin_as_done_by_that_admin_and_shows_it_on_the_audit_page(vera, superuser):
    admin = client_for(superuser)
    data = _change_form(admin, vera)
    data["groups"] = list(Group.objects.filter(name__in=[VIEWER, OPERATOR]).values_list("pk", flat=True))
    data["tenant_scope-0-tenants"] = "acme,globex"
    before = len(_entries(vera))

    response = admin.post(reverse("admin:auth_user_change", args=[vera.pk]), data)

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    assert set(vera.groups.values_list("name", flat=True)) == {VIEWER, OPERATOR}
    assert TenantScope.objects.get(user=vera).tenants == ["acme", "globex"]
    entries = _entries(vera)[before:]
    assert len(entries) == 1  # one save of the page, one entry
    entry = entries[0]
    assert (entry.actor, entry.actor_label, entry.outcome) == (superuser, superuser.username, "ok")
    assert entry.before["groups"] == [VIEWER] and entry.before["tenants"] is None
    assert entry.after["groups"] == [OPERATOR, VIEWER] and entry.after["tenants"] == ["acme", "globex"]
    assert "+operator" in entry.message and "every tenant -> acme, globex" in entry.message

    page = client_for(superuser).get(reverse("console:audit"), {"action": ACTION}).content.decode()
    row = next(r for r in re.findall(r"<tr.*?</tr>", page, re.S) if "+operator" in r)
    assert superuser.username in row and "vera2" in row


def test_it_audits_changes_made_from_a_shell_as_system(vera):
    operator = Group.objects.get(name=OPERATOR)
    vera.groups.add(operator)
    operator.user_set.remove(vera)  # from the group's side
    vera.is_staff = True
    vera.save()
    vera.last_login = vera.date_joined
    vera.save(update_fields=["last_login"])  # no role change: no entry
    TenantScope.objects.create(user=vera, tenants=["acme"])
    TenantScope.objects.filter(user=vera).delete()

    messages = [e.message for e in _entries(vera)]
    assert messages == [
        "vera2: groups +viewer",
        "vera2: groups +operator",
        "vera2: groups -operator",
        "vera2: is_staff on",
        "vera2: tenants: every tenant -> acme",
        "vera2: tenants: acme -> every tenant",
    ]
    assert {e.actor_label for e in _entries(vera)} == {"system"}


def test_it_writes_no_entry_for_a_change_that_rolls_back(vera):
    before = len(_entries(vera))
    with pytest.raises(RuntimeError), transaction.atomic():
        vera.groups.add(Group.objects.get(name=OPERATOR))
        raise RuntimeError("the change fails")
    assert len(_entries(vera)) == before and not vera.groups.filter(name=OPERATOR).exists()


def test_it_limits_a_user_to_tenants_with_createuser_and_audits_it(db):
    call_command("createuser", "tess", "--role", "operator", "--tenants", "acme, globex",
                 "--password", "a-long-enough-password-42")
    tess = User.objects.get(username="tess")
    assert TenantScope.objects.get(user=tess).tenants == ["acme", "globex"]
    assert [e.after["tenants"] for e in _entries(tess)][-1] == ["acme", "globex"]


def test_it_does_not_log_deleting_a_limited_user_as_lifting_their_limit(vera):
    TenantScope.objects.create(user=vera, tenants=["acme"])
    pk = vera.pk
    vera.delete()
    assert not AuditEntry.objects.filter(object_id=str(pk), message__contains="every tenant").exclude(
        message__contains="every tenant -> acme").exists()

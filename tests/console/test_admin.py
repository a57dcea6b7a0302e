"""The Django admin: every model is there, read-only for viewers, and nobody may edit what would
bypass the console's roles and audit log (runs, effects, the journal, the audit log itself)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission, User
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.utils import timezone

from ledger.models import EffectRecord, EffectStatus
from operators import roles
from operators.models import AuditEntry
from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.versions.registry import workflow

pytestmark = pytest.mark.django_db


@workflow("admin_plain", version=1)
def admin_plain(ctx, spec):
    return spec


def _user(name: str, *groups: str, **fields) -> User:
    user = User.objects.create_user(name, password="pw-for-tests", **fields)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def test_it_registers_every_model_of_the_project_in_the_admin():
    from django.apps import apps

    missing = [
        m._meta.label for label in ("ledger", "sagas", "console", "demo")
        for m in apps.get_app_config(label).get_models() if not admin.site.is_registered(m)
    ]
    assert missing == []


def test_it_makes_the_admin_read_only_for_viewers():
    run = start("admin_plain", {})
    change_run = Permission.objects.get(codename="change_workflowrun")
    viewer = _user("auditor", roles.VIEWER, is_staff=True)
    viewer.user_permissions.add(change_run)  # even an explicit permission does not let a viewer write
    for codename in ("add_providerfault", "change_providerfault"):
        viewer.user_permissions.add(Permission.objects.get(codename=codename))

    client = Client()
    client.force_login(viewer)
    assert client.get("/admin/sagas/workflowrun/").status_code == 200
    page = client.get(f"/admin/sagas/workflowrun/{run.id}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get("/admin/ledger/effectrecord/").status_code == 200
    assert client.get("/admin/sagas/workflowrun/add/").status_code == 403
    assert client.post(f"/admin/sagas/workflowrun/{run.id}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/demo/providerfault/add/").status_code == 403
    assert WorkflowRun.objects.filter(id=run.id).exists()


def test_it_lets_nobody_edit_runs_or_effects_in_the_admin_because_that_would_bypass_roles_and_audit():
    run = start("admin_plain", {})
    operator = _user("opal", roles.VIEWER, roles.OPERATOR, is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=["sagas", "ledger", "demo"]))
    root = User.objects.create_superuser("root", password="pw-for-tests")

    for user in (operator, root):
        client = Client()
        client.force_login(user)
        page = client.get(f"/admin/sagas/workflowrun/{run.id}/change/")
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
        posted = client.post(f"/admin/sagas/workflowrun/{run.id}/change/", {"status": "COMPLETED"})
        assert posted.status_code == 403
        assert client.post(f"/admin/sagas/workflowrun/{run.id}/delete/", {"post": "yes"}).status_code == 403
        assert client.get("/admin/ledger/effectrecord/add/").status_code == 403
        assert client.get("/admin/demo/providerexecution/add/").status_code == 403
        # The demo providers' fault injection stays writable for those allowed to write.
        assert client.get("/admin/demo/providerfault/add/").status_code == 200
    assert WorkflowRun.objects.get(id=run.id).status == RunStatus.PENDING


def test_it_keeps_the_audit_log_and_the_journal_read_only_for_superusers():
    run = start("admin_plain", {})
    entry = JournalEntry.objects.get(run=run, seq=1)
    audit = AuditEntry.objects.create(actor_label="op", action="run.cancel", object_type="run", object_id="x",
                                      outcome="ok")
    root = User.objects.create_superuser("root", password="pw-for-tests")
    client = Client()
    client.force_login(root)
    for url in (f"/admin/sagas/journalentry/{entry.pk}/change/", f"/admin/operators/auditentry/{audit.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get("/admin/operators/auditentry/add/").status_code == 403
    assert client.post(f"/admin/sagas/journalentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/sagas/journalentry/").status_code == 200
    assert WorkflowRun.objects.get(id=run.id).status == RunStatus.PENDING


def test_it_has_the_database_refuse_to_rewrite_or_delete_an_audit_entry_whoever_asks():
    audit = AuditEntry.objects.create(actor_label="op", action="run.cancel", object_type="run", object_id="x",
                                      outcome="ok")
    for statement in ("UPDATE console_auditentry SET actor_label = 'someone else' WHERE id = %s",
                      "DELETE FROM console_auditentry WHERE id = %s"):
        with pytest.raises(DatabaseError, match="console_auditentry is append-only"), transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(statement, [audit.pk])
    assert AuditEntry.objects.get(pk=audit.pk).actor_label == "op"


def test_it_finds_runs_their_history_and_their_effects_in_the_admin():
    run = start("admin_plain", {}, business_key="order-1842")
    other = start("admin_plain", {}, business_key="order-1843")
    client = Client()
    client.force_login(_user("auditor", roles.VIEWER, is_staff=True))

    def listed(url: str, term: str) -> str:
        page = client.get(url, {"q": term})
        assert page.status_code == 200
        return page.content.decode()

    by_key = listed("/admin/sagas/workflowrun/", "order-1842")
    assert str(run.id) in by_key and str(other.id) not in by_key
    by_id = listed("/admin/sagas/workflowrun/", str(other.id))  # the search box shows the term itself
    assert "order-1843" in by_id and "order-1842" not in by_id
    journal = listed("/admin/sagas/journalentry/", str(run.id))
    assert "1 journal entry" in journal and str(other.id) not in journal
    assert "0 journal entries" in listed("/admin/sagas/journalentry/", "not-a-run-id")

    # Effects: by the run's id, or by an idempotency key (exact).
    key = f"{run.id}:capture"
    EffectRecord.objects.create(tenant="default", idempotency_key=key, run_id=run.id, step_name="capture",
                                connector="payments.capture", request_payload={}, payload_hash="0" * 64,
                                status=EffectStatus.SUCCEEDED, intent_at=timezone.now(), attempts=1)
    for term in (key, str(run.id)):
        found = listed("/admin/ledger/effectrecord/", term)
        assert "1 effect record" in found and f"<td class=\"field-idempotency_key\">{key}</td>" in found, term
    for term in ("no-such-key", str(other.id), key[:-1]):
        nothing = listed("/admin/ledger/effectrecord/", term)
        assert "0 effect records" in nothing and key not in nothing, term


def test_it_never_finds_an_audit_entry_by_text_the_admin_shows_redacted():
    AuditEntry.objects.create(actor_label="op-ines", action="run.cancel", object_type="run", object_id="row-7",
                              outcome="ok", reason="retry with password=hunter2-xyz", message="api_key=sk-live-9")
    client = Client()
    client.force_login(_user("auditor", roles.VIEWER, is_staff=True))

    def found(term: str) -> bool:
        page = client.get("/admin/operators/auditentry/", {"q": term})
        assert page.status_code == 200
        return "row-7" in page.content.decode()

    assert found("op-ines") and found("row-7")
    for guess in ("hunter2", "password=h", "sk-live", "retry with"):
        assert not found(guess), guess  # a substring search would reveal the secret one character at a time

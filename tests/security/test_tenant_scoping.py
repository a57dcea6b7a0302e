"""Tenant scoping: a user limited to tenant "acme" sees and acts on acme's runs, effects,
approvals and audit entries only, on every page, filter, export, action and live socket; to
them another tenant's run does not exist (404, not 403). A user with no limit sees both."""

from __future__ import annotations

import csv
import io
import re
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from config.asgi import application
from ledger.models import EffectStatus
from operators.models import AuditEntry, AuditOutcome, TenantScope
from operators.roles import APPROVER, OPERATOR, VIEWER, ensure_groups
from operators.services.tenancy import OUTSIDE_TENANTS
from sagas.models import ApprovalState, RunStatus, WorkflowVersion
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, make_run, resolve, text
from tests.console.test_overview import queue_rows, status_cards

pytestmark = pytest.mark.django_db

TENANTS = ("acme", "globex")


def _tenant(name: str) -> SimpleNamespace:
    """One tenant's objects: a run waiting on an UNKNOWN effect, a run waiting for an approval,
    and a run stranded by a version mismatch; every name says its tenant."""
    run = make_run(tenant=name, business_key=f"{name}-order-1")
    effect = make_effect(run=run, tenant=name, step=f"{name}_capture")
    waiting = make_run(tenant=name, business_key=f"{name}-order-2", status=RunStatus.WAITING, reason="")
    approval = make_approval(run=waiting, step=f"{name}_ship")
    stranded = make_run(tenant=name, business_key=f"{name}-order-3", reason="version_mismatch")
    return SimpleNamespace(run=run, effect=effect, waiting=waiting, approval=approval, stranded=stranded)


@pytest.fixture
def world(people):
    """Both tenants' objects, ``lim`` (every role, limited to acme) and ``all`` (every role, no
    limit)."""
    ensure_groups()
    WorkflowVersion.objects.create(name="qp_orders", version=1, definition_hash="a" * 64, source="def f(): ...\n",
                                   module="tests.qp")
    users = {}
    for name in ("lim", "all"):
        user = User.objects.create_user(name, password=f"pw-{name}-long-enough")
        user.groups.add(*Group.objects.filter(name__in=[VIEWER, OPERATOR, APPROVER]))
        users[name] = user
    TenantScope.objects.create(user=users["lim"], tenants=["acme"])
    return SimpleNamespace(acme=_tenant("acme"), globex=_tenant("globex"), **users)


def _keys(page: str) -> set[str]:
    return set(re.findall(r"\b(acme|globex)-order-\d", page))


def _listed(page: str, world: SimpleNamespace) -> set[str]:
    """The tenants with a run linked from ``page`` (the runs list links each run it lists)."""
    linked = set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', page))
    return {t for t in TENANTS for run in ("run", "waiting", "stranded")
            if str(getattr(getattr(world, t), run).id) in linked}


def test_it_lists_only_the_users_tenants_runs_and_no_filter_widens_that(world):
    lim, everyone = client_for(world.lim), client_for(world.all)
    runs = reverse("console:runs")

    assert _listed(text(lim.get(runs)), world) == {"acme"}
    assert _listed(text(everyone.get(runs)), world) == {"acme", "globex"}
    for query in ({"tenant": "globex"}, {"q": "globex-order-1"}, {"q": str(world.globex.run.id)},
                  {"q": world.globex.run.id.hex[:8]}, {"status": RunStatus.WAITING, "tenant": "globex"}):
        assert _listed(text(lim.get(runs, query)), world) == set(), query
        assert _listed(text(everyone.get(runs, query)), world) == {"globex"}, query
    assert _listed(text(lim.get(runs, {"tenant": "acme"})), world) == {"acme"}


def test_it_answers_404_for_every_page_of_another_tenants_run(world):
    lim = client_for(world.lim)
    for name in ("console:run", "console:run_history", "console:run_history_json", "console:run_compensate"):
        for tenant, status in (("globex", 404), ("acme", 200)):
            run = getattr(world, tenant).run
            response = lim.get(reverse(name, args=[run.id]))
            assert response.status_code == status, (name, tenant)
            body = b"".join(response) if response.streaming else response.content
            assert (b"globex-order" in body) == (tenant == "globex" and status != 404), (name, tenant)
    assert client_for(world.all).get(reverse("console:run", args=[world.globex.run.id])).status_code == 200


def _denied(user: User, action: str, object_id) -> AuditEntry:
    return AuditEntry.objects.get(actor=user, action=action, object_id=str(object_id), outcome=AuditOutcome.DENIED)


def test_it_refuses_every_action_on_another_tenants_objects_as_not_found_and_audits_it(world):
    lim = client_for(world.lim)
    globex = world.globex
    for action in ("cancel", "retry", "compensate"):
        response = lim.post(reverse(f"console:run_{action}", args=[globex.run.id]),
                            {"reason": "not mine", "expected": RunStatus.NEEDS_ATTENTION})
        assert response.status_code == 404, action
        entry = _denied(world.lim, f"run.{action}", globex.run.id)
        assert entry.message == OUTSIDE_TENANTS and entry.tenant == "globex"
    globex.run.refresh_from_db()
    assert globex.run.status == RunStatus.NEEDS_ATTENTION

    assert lim.post(reverse("console:effect_query", args=[globex.effect.id])).status_code == 404
    assert resolve(lim, globex.effect).status_code == 404
    globex.effect.refresh_from_db()
    assert globex.effect.status == EffectStatus.UNKNOWN
    for action in ("effect.query", "effect.resolve"):
        assert _denied(world.lim, action, globex.effect.id).tenant == "globex"

    for decision in ("approve", "reject"):
        response = lim.post(reverse("console:approval_decide", args=[globex.approval.id]),
                            {"decision": decision, "comment": "not mine", "expected": ApprovalState.PENDING})
        assert response.status_code == 404
        assert _denied(world.lim, f"approval.{decision}", globex.approval.id).tenant == "globex"
    globex.approval.refresh_from_db()
    assert globex.approval.state == ApprovalState.PENDING

    # The same user may act on their own tenant's run: the 404s above are the tenant, not the role.
    response = lim.post(reverse("console:run_cancel", args=[world.acme.run.id]),
                        {"reason": "mine", "expected": RunStatus.NEEDS_ATTENTION})
    assert response.status_code == 302
    world.acme.run.refresh_from_db()
    assert world.acme.run.status == RunStatus.CANCELLED


def test_it_shows_only_the_users_tenants_in_the_effects_queue_and_the_approvals_inbox(world):
    for user, seen in ((world.lim, {"acme"}), (world.all, {"acme", "globex"})):
        client = client_for(user)
        effects = text(client.get(reverse("console:effects")))
        assert set(re.findall(r"(acme|globex)_capture", effects)) == seen
        approvals = text(client.get(reverse("console:approvals")))
        assert set(re.findall(r"(acme|globex)_ship", approvals)) == seen


def test_it_counts_only_the_users_tenants_on_the_overview(world):
    for user, n in ((world.lim, "1"), (world.all, "2")):
        html = text(client_for(user).get(reverse("console:overview")))
        cards = status_cards(html)
        assert (cards["NEEDS_ATTENTION"], cards["WAITING"]) == (str(2 * int(n)), n)
        queues = {label: count for label, (count, _) in queue_rows(html).items()}
        assert (queues["Unknown effects"], queues["Pending approvals"], queues["Version mismatches"]) == (n, n, n)


def test_it_counts_and_lists_only_the_users_tenants_runs_on_the_versions_page(world):
    for user, in_flight, seen in ((world.lim, "3", {"acme"}), (world.all, "6", {"acme", "globex"})):
        page = text(client_for(user).get(reverse("console:versions")))
        row = next(r for r in re.findall(r"<tr.*?</tr>", page, re.S) if f">{'a' * 12}<" in r and 'class="num"' in r)
        assert re.search(rf'class="num">{in_flight}<', row), row
        stranded = {t for t in TENANTS if f'href="/runs/{getattr(world, t).stranded.id}/"' in page}
        assert stranded == seen


def test_it_shows_only_audit_entries_about_the_users_tenants_on_the_page_and_in_the_csv(world):
    operator = client_for(world.all)
    for tenant in TENANTS:
        assert resolve(operator, getattr(world, tenant).effect, note=f"checked the {tenant} ledger").status_code == 302
    client_for(world.lim).post(reverse("console:effect_query", args=[world.globex.effect.id]))  # denied, audited

    def read(user: User) -> tuple[set[str], set[str], bool]:
        client = client_for(user)
        page = text(client.get(reverse("console:audit")))
        rows = list(csv.DictReader(io.StringIO(b"".join(client.get(reverse("console:audit_csv"))).decode())))
        return (set(re.findall(r"the (acme|globex) ledger", page)),
                {re.search(r"the (\w+) ledger", r["reason"]).group(1) for r in rows if "ledger" in r["reason"]},
                any(r["action"] == "user.roles" for r in rows) or OUTSIDE_TENANTS in page)

    assert read(world.lim) == ({"acme"}, {"acme"}, False)
    assert read(world.all) == ({"acme", "globex"}, {"acme", "globex"}, True)
    for tenant, status in (("acme", 200), ("globex", 404)):  # a value "show all of it" loads on demand
        entry = AuditEntry.objects.get(action="effect.resolve", object_id=str(getattr(world, tenant).effect.id))
        url = reverse("console:audit_payload", args=[entry.id, "reason"])
        assert client_for(world.lim).get(url).status_code == status, tenant
        assert client_for(world.all).get(url).status_code == 200


def test_it_shows_a_user_limited_to_no_tenant_nothing_rather_than_everything(world):
    """An emptied limit is not "no limit": removing the last tenant never widens what one sees."""
    TenantScope.objects.filter(user=world.lim).update(tenants=[])
    lim = client_for(world.lim)
    for name in ("console:overview", "console:runs", "console:effects", "console:approvals", "console:versions",
                 "console:audit", "console:audit_csv"):
        response = lim.get(reverse(name))
        body = b"".join(response) if response.streaming else response.content
        assert response.status_code == 200 and b"acme" not in body and b"globex" not in body, name
    cards = status_cards(text(lim.get(reverse("console:overview"))))
    assert set(cards.values()) == {"0"}


def test_it_shows_a_tenant_limited_staff_user_none_of_the_engines_rows_in_the_django_admin(world):
    for user in (world.lim, world.all):
        user.is_staff = True
        user.save()
    runs = reverse("admin:sagas_workflowrun_changelist")
    assert client_for(world.lim).get(runs).status_code == 403
    assert client_for(world.lim).get(reverse("admin:sagas_workflowrun_change", args=[world.acme.run.id])
                                      ).status_code == 403
    page = client_for(world.all).get(runs)
    assert page.status_code == 200 and str(world.globex.run.id) in page.content.decode()


def _cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


@pytest.mark.django_db(transaction=True)
def test_it_subscribes_no_live_socket_to_another_tenants_run_and_pushes_lists_within_the_tenants(people):
    ensure_groups()
    lim = User.objects.create_user("lim", password="pw-lim-long-enough")
    lim.groups.add(Group.objects.get(name=VIEWER))
    TenantScope.objects.create(user=lim, tenants=["acme"])
    acme = make_run(tenant="acme", business_key="acme-order-1")
    globex = make_run(tenant="globex", business_key="globex-order-1")
    cookie = _cookie(lim)

    def socket(query: str) -> WebsocketCommunicator:
        return WebsocketCommunicator(application, f"/ws/live/?{query}",
                                     headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])

    async def scenario():
        foreign = socket(f"fragments=run_header,run_effects&run={globex.id}")
        connected, _ = await foreign.connect(timeout=5)
        assert not connected
        assert await foreign.receive_nothing(timeout=0.5)

        own = socket(f"fragments=run_header&run={acme.id}")
        assert (await own.connect(timeout=5))[0]
        assert "acme-order-1" in await own.receive_from(timeout=5)
        await own.disconnect()

        runs = socket("fragments=runs_table")
        assert (await runs.connect(timeout=5))[0]
        pushed = await runs.receive_from(timeout=5)
        assert _keys(pushed) == {"acme"}
        await runs.disconnect()

    async_to_sync(scenario)()

"""Single sign-on with OpenID Connect, against a real provider (django-oauth-toolkit in a process of
its own, tests/oidc_provider) and a console daphne configured for it, passwords off: both
started once for this module.

The provider's claims: ``groups`` (alice: ops-approvers, ops-staff; bob: ops-staff) and
``tenants`` (alice: acme; bob: globex); the console maps ops-approvers to approver, ops-staff to
operator, and takes the tenants claim as the tenant limit. Its access tokens last 3 s, so the
console refreshes them as it goes, as it must with providers whose tokens are short-lived.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from playwright.sync_api import expect

from console.models import SsoIdentity
from console.oidc import CHECKED_AT
from console.services.sso import (
    SSO_ACTOR,
    SignInRefused,
    check_settings,
    roles_from_claims,
    sso_sign_in,
    tenants_from_claims,
)
from operators.models import AuditEntry, AuditOutcome, TenantScope
from tests.browser.a11y import AXE, FAILING, RUN_AXE, TAGS
from tests.browser.conftest import SHOTS, _free_port
from tests.console.run_data import waiting_run
from tests.oidc_provider.control import Provider, start_provider
from tests.oidc_provider.people import CLIENT_ID, CLIENT_SECRET
from tests.oidc_provider.people import PASSWORD as PROVIDER_PASSWORD
from tests.procs import Proc, Procs, wait_until, worker_env

PROVIDER = "Example ID"
ROLE_MAP = {"ops-approvers": "approver", "ops-staff": "operator", "auditors": "viewer"}
TOKEN_SECONDS = 3


def sso_settings(provider_url: str = "http://127.0.0.1:9") -> dict[str, str]:
    """The console's environment for single sign-on with the test provider, passwords off."""
    endpoints = Provider(None, provider_url, None).endpoints()  # type: ignore[arg-type]
    return {
        "SAGA_OIDC_ENABLED": "1", "SAGA_OIDC_PROVIDER_NAME": PROVIDER, "SAGA_LOCAL_PASSWORDS": "0",
        "SAGA_OIDC_ROLE_MAP": json.dumps(ROLE_MAP), "SAGA_OIDC_TENANT_CLAIM": "tenants",
        "SAGA_OIDC_RECHECK_SECONDS": "0", "OIDC_RP_CLIENT_ID": CLIENT_ID, "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
        **endpoints,
    }


@dataclass
class Sso:
    provider: Provider
    base: str
    daphne: Proc
    procs: Procs


@pytest.fixture(scope="module")
def sso(django_db_setup, django_db_blocker, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sso")
    procs = Procs(folder)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        provider = start_provider(procs, folder, [f"{base}/oidc/callback/"],
                                  OIDC_PROVIDER_TOKEN_SECONDS=str(TOKEN_SECONDS))
        with django_db_blocker.unblock():
            env = worker_env("tests.console.run_data", **sso_settings(provider.url))
        daphne = procs.start("daphne-sso", ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                            "config.asgi:application"], env)
        wait_until(lambda: "Listening on TCP address" in daphne.log() or not daphne.alive(), 30, what="daphne")
        assert daphne.alive(), daphne.log()
        yield Sso(provider, base, daphne, procs)
    finally:
        procs.stop_all()


@pytest.fixture
def browse(sso, browser, _playwright_loop, transactional_db, request):
    """New browser contexts on the SSO console (closed after the test)."""
    contexts = []

    def page():
        context = browser.new_context(base_url=sso.base)
        context.add_init_script(path=str(AXE))  # defines window.axe only (see tests/browser/a11y.py)
        contexts.append(context)
        return context.new_page()

    yield page
    for context in contexts:
        context.close()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(sso.procs.logs())
    assert sso.daphne.alive() and sso.provider.proc.alive(), sso.procs.logs()


def sign_in_at_provider(page, sso: Sso, username: str) -> None:
    """From the console's login page: the button, the provider's form, and back."""
    page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()
    page.wait_for_url(re.compile(re.escape(sso.provider.url) + r"/accounts/login/"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PROVIDER_PASSWORD)
    page.get_by_role("button", name="Sign in to Example ID").click()
    page.wait_for_url(re.compile(re.escape(sso.base) + r"/(?!login)"))


def xmin(table: str, where: str, params: list) -> str:
    """The transaction that wrote the row (PostgreSQL's xmin): rows of one transaction share it."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT xmin::text FROM {table} WHERE {where}", params)
        rows = cur.fetchall()
    assert len(rows) == 1, (table, rows)
    return rows[0][0]


def test_it_signs_in_through_the_provider_with_the_roles_and_tenant_its_claims_map_to(sso, browse):
    acme = waiting_run("sso-acme-1", tenant="acme")
    waiting_run("sso-globex-1", tenant="globex")
    page = browse()
    page.goto(f"/runs/{acme.id}/")
    expect(page.get_by_role("link", name=f"Sign in with {PROVIDER}")).to_be_visible()
    expect(page.locator("input[name=password]")).to_have_count(0)  # local passwords are off
    assert [v for v in page.evaluate(RUN_AXE, TAGS) if v["impact"] in FAILING] == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "login-single-sign-on.png"))  # for people to look at

    sign_in_at_provider(page, sso, "alice")
    assert page.url == f"{sso.base}/runs/{acme.id}/"  # back where she was going
    expect(page.locator("header .user")).to_have_text("alice · approver, operator")
    expect(page.get_by_role("link", name="Approve or reject…")).to_be_visible()
    page.goto("/runs/")
    expect(page.get_by_text("sso-acme-1")).to_be_visible()
    expect(page.get_by_text("sso-globex-1")).to_have_count(0)  # another tenant's run

    alice = get_user_model().objects.get(username="alice")
    assert alice.sso_identity.subject and not alice.has_usable_password()
    assert TenantScope.objects.get(user=alice).tenants == ["acme"]
    login = AuditEntry.objects.get(action="auth.login", actor=alice)
    roles = AuditEntry.objects.get(action="user.roles", object_id=str(alice.pk))
    assert (login.outcome, login.message) == (AuditOutcome.OK, f"signed in through {PROVIDER}; a new console user")
    assert roles.actor_label == SSO_ACTOR and "ops-approvers" in roles.reason
    assert "+approver" in roles.message and "tenants: every tenant -> acme" in roles.message
    # The link, her roles, her tenant limit and both entries: one transaction (her user row was
    # written again since, by the login's last_login).
    approver = Group.objects.get(name="approver")
    writers = {xmin("console_auditentry", "id = %s", [login.id]), xmin("console_auditentry", "id = %s", [roles.id]),
               xmin("console_ssoidentity", "user_id = %s", [alice.pk]),
               xmin("console_tenantscope", "user_id = %s", [alice.pk]),
               xmin("auth_user_groups", "user_id = %s AND group_id = %s", [alice.pk, approver.pk])}
    assert len(writers) == 1, writers

    # Her access token expires; the console refreshes it with the provider and she stays in.
    time.sleep(TOKEN_SECONDS + 0.5)
    page.goto(f"/runs/{acme.id}/")
    expect(page.get_by_role("link", name="Approve or reject…")).to_be_visible()

    # The provider takes her out of ops-approvers: at her next sign-in the role is gone.
    sso.provider.remove_from_group("alice", "ops-approvers")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(re.compile(r".*/login/"))
    page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()  # still signed in at the provider
    page.wait_for_url(re.compile(re.escape(sso.base) + r"/$"))
    expect(page.locator("header .user")).to_have_text("alice · operator")
    page.goto(f"/runs/{acme.id}/")
    expect(page.locator("summary", has_text="Cancel…")).to_be_visible()  # still an operator
    expect(page.get_by_role("link", name="Approve or reject…")).to_have_count(0)
    removed = AuditEntry.objects.filter(action="user.roles", object_id=str(alice.pk)).order_by("-id").first()
    assert removed.message == "alice: groups -approver" and removed.actor_label == SSO_ACTOR
    assert AuditEntry.objects.filter(action="auth.login", actor=alice, outcome=AuditOutcome.OK).count() == 2


def test_it_ends_the_session_of_a_user_deactivated_at_the_provider(sso, browse):
    run = waiting_run("sso-globex-2", tenant="globex")
    page = browse()
    page.goto(f"/runs/{run.id}/")
    sign_in_at_provider(page, sso, "bob")
    expect(page.locator("summary", has_text="Cancel…")).to_be_visible()  # an operator (ops-staff)
    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")

    sso.provider.set_active("bob", False)
    try:
        # His next request, an action posted by htmx, is refused: the session ends there.
        answer = page.request.post(f"/runs/{run.id}/cancel/", form={"reason": "late", "expected": run.status},
                                   headers={"HX-Request": "true", "X-CSRFToken": token}, max_redirects=0)
        assert answer.headers.get("hx-redirect") == "/login/", (answer.status, answer.headers)
        run.refresh_from_db()
        assert run.status == "WAITING"  # not cancelled
        bob = get_user_model().objects.get(username="bob")
        ended = AuditEntry.objects.get(action="auth.session_end", actor=bob)
        assert ended.outcome == AuditOutcome.DENIED and PROVIDER in ended.message
        assert not AuditEntry.objects.filter(action="run.cancel").exists()
        page.reload()
        page.wait_for_url(re.compile(r".*/login/\?next=/runs/"))
        expect(page.locator("#messages")).to_contain_text(
            f"You were signed out: {PROVIDER} no longer accepts your sign-in")
        # Nor can he sign in again: the provider refuses him.
        page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()
        page.wait_for_url(re.compile(re.escape(sso.provider.url) + r"/accounts/login/"))
        page.fill("input[name=username]", "bob")
        page.fill("input[name=password]", PROVIDER_PASSWORD)
        page.get_by_role("button", name="Sign in to Example ID").click()
        expect(page.locator("#provider-error")).to_be_visible()
    finally:
        sso.provider.set_active("bob", True)


# --- in this process: passwords off, refusals, the claim mapping --------------------------------


@pytest.fixture
def sso_on(settings):
    for name, value in sso_settings().items():
        setattr(settings, name, {"1": True, "0": False}.get(value, value))
    settings.SAGA_OIDC_ROLE_MAP = {k: [v] for k, v in ROLE_MAP.items()}
    settings.SAGA_OIDC_RECHECK_SECONDS = 0.0
    settings.AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "console.oidc.BreakGlassBackend",
                                        "console.oidc.SsoBackend"]
    return settings


def test_it_refuses_passwords_when_they_are_off_but_a_superuser_may_break_glass(client, db, sso_on):
    from django.contrib.auth.hashers import make_password

    olga = get_user_model().objects.create(username="olga", password=make_password("olga-password-1"),
                                           is_staff=True)
    get_user_model().objects.create(username="root", password=make_password("root-password-1"), is_superuser=True,
                                    is_staff=True)
    sso_on.SAGA_LOCAL_PASSWORDS = True  # both ways in
    page = client.get("/login/?next=/runs/").content.decode()
    assert f'href="/oidc/authenticate/?next=/runs/">Sign in with {PROVIDER}' in page and 'name="password"' in page
    assert client.get("/login/break-glass/").status_code == 404  # the login page has the form
    sso_on.SAGA_LOCAL_PASSWORDS = False
    page = client.get("/login/").content.decode()
    assert f"Sign in with {PROVIDER}" in page and 'name="password"' not in page

    refused = client.post("/login/", {"username": "olga", "password": "olga-password-1"})
    assert refused.status_code == 403 and "Signing in with a password is turned off here" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    client.post("/admin/login/", {"username": "olga", "password": "olga-password-1", "next": "/admin/"})
    assert "_auth_user_id" not in client.session  # nor at the admin's form
    wrong = client.post("/login/break-glass/", {"username": "olga", "password": "olga-password-1"})
    assert "Wrong username or password" in wrong.content.decode() and "_auth_user_id" not in client.session

    assert client.post("/login/break-glass/", {"username": "root", "password": "root-password-1"}).status_code == 302
    assert client.get("/runs/").status_code == 200
    entry = AuditEntry.objects.get(action="auth.login")
    assert (entry.actor_label, entry.outcome) == ("root", AuditOutcome.OK) and "break-glass" in entry.message
    assert olga.has_usable_password()  # untouched: it just signs in nowhere while passwords are off


def test_it_never_takes_over_a_superuser_and_links_an_ordinary_local_account(db, sso_on):
    from django.contrib.auth.hashers import make_password

    users = get_user_model().objects
    users.create(username="root", password=make_password("root-password-1"), is_superuser=True)
    with pytest.raises(SignInRefused, match="superuser"):
        sso_sign_in(claims={"sub": "s-1", "preferred_username": "root", "groups": ["ops-staff"]}, ip="10.0.0.1")
    denied = AuditEntry.objects.get(action="auth.login")
    assert (denied.outcome, denied.actor_label, denied.ip) == (AuditOutcome.DENIED, "root", "10.0.0.1")
    assert not SsoIdentity.objects.exists() and not users.get(username="root").groups.exists()

    olga = users.create(username="olga", password=make_password("olga-password-1"))
    linked = sso_sign_in(claims={"sub": "s-2", "preferred_username": "olga", "groups": "ops-staff",
                                 "tenants": ["globex", "acme"]}, ip=None)
    assert linked == olga and not users.get(pk=olga.pk).has_usable_password()
    assert [g.name for g in olga.groups.all()] == ["operator"]
    assert TenantScope.objects.get(user=olga).tenants == ["acme", "globex"]
    # The same subject under a new username is still olga; another subject may not take her name.
    assert sso_sign_in(claims={"sub": "s-2", "preferred_username": "olga.new", "tenants": []}, ip=None) == olga
    assert not olga.groups.exists() and TenantScope.objects.get(user=olga).tenants == []
    with pytest.raises(SignInRefused, match="another identity"):
        sso_sign_in(claims={"sub": "s-3", "preferred_username": "olga"}, ip=None)


def test_it_ends_the_session_of_a_user_deactivated_in_the_console(client, db, sso_on):
    sso_on.SAGA_OIDC_RECHECK_SECONDS = 3600.0  # the provider is not asked: the console's own check
    olga = sso_sign_in(claims={"sub": "s-9", "preferred_username": "olga", "groups": ["ops-staff"]}, ip=None)
    client.force_login(olga, backend="console.oidc.SsoBackend")
    session = client.session
    session[CHECKED_AT] = time.time()
    session.save()
    assert client.get("/runs/").status_code == 200
    olga.is_active = False
    olga.save()
    signed_out = client.get("/runs/")
    assert signed_out.status_code == 302 and signed_out.url.startswith("/login/")


def test_it_maps_claims_to_roles_and_tenants_as_configured(sso_on):
    sso_on.SAGA_OIDC_ROLE_MAP = {"ops": ["operator", "viewer"], "approvers": ["approver"]}
    assert roles_from_claims({"groups": ["ops", "unknown"]}) == ["operator", "viewer"]
    assert roles_from_claims({"groups": "approvers"}) == ["approver"]
    assert roles_from_claims({}) == []
    assert tenants_from_claims({}) == []  # no claim: no tenant, never every tenant
    assert tenants_from_claims({"tenants": ["acme", "*"]}) is None
    sso_on.SAGA_OIDC_TENANT_CLAIM = "groups"
    sso_on.SAGA_OIDC_TENANT_MAP = {"acme-staff": ["acme"], "all-tenants": ["*"]}
    assert tenants_from_claims({"groups": ["ops", "acme-staff"]}) == ["acme"]
    assert tenants_from_claims({"groups": ["all-tenants"]}) is None
    with pytest.raises(SignInRefused, match="neither a string nor a list"):
        roles_from_claims({"groups": {"ops": True}})
    sso_on.SAGA_OIDC_ROLE_MAP = {"ops": ["operator", "aprover"]}  # a typo stops the process at start-up
    with pytest.raises(ImproperlyConfigured, match="'aprover', which is not a role"):
        check_settings()

"""A real browser (Debian's Chromium driven by Playwright) against daphne with websockets,
real workers and the simulated providers, all on the test database."""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connections

from console import roles
from tests.procs import ROOT, start_providers, wait_until, worker_env

# Playwright's sync API runs an event loop in this thread; Django's ORM calls from the test
# body are still synchronous and safe here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-artifacts" / "screenshots"
MODULES = "tests.ledger.wf_sagas,tests.ledger.wf_orders"
PASSWORD = "correct-horse-battery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    def __init__(self, base: str, browser, procs, providers_url: str) -> None:
        self.base, self.browser, self.procs, self.providers_url = base, browser, procs, providers_url

    def page(self, username: str):
        context = self.browser.new_context(base_url=self.base)
        page = context.new_page()
        page.on("dialog", lambda d: (_ for _ in ()).throw(AssertionError(f"a script ran: dialog {d.message!r}")))
        page.goto("/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/$"))
        return page

    def shot(self, page, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def worker(self, name: str, **env: str):
        return self.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=self.providers_url, **env)


@functools.lru_cache(maxsize=1)
def _password_hash() -> str:
    """Hashed once (the real hasher, which daphne's settings verify), shared by the users."""
    from django.contrib.auth.hashers import make_password

    return make_password(PASSWORD)


@pytest.fixture
def users(transactional_db):
    roles.ensure_groups()
    made = {}
    for name, role in (("olga", "operator"), ("ann", "approver"), ("vic", "viewer"), ("sam", "operator")):
        user = get_user_model().objects.create(username=name, password=_password_hash())
        user.groups.add(Group.objects.get(name=role))
        made[name] = user
    return made


@pytest.fixture
def console(procs, users, settings):
    from playwright.sync_api import sync_playwright

    providers_url = start_providers(procs)
    settings.DEMO_PROVIDERS_URL = providers_url
    port = _free_port()
    env = worker_env(MODULES, DEMO_PROVIDERS_URL=providers_url)
    daphne = procs.start("daphne", ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                         env)
    wait_until(lambda: "Listening on TCP address" in daphne.log() or not daphne.alive(), 30, what="daphne")
    assert daphne.alive(), daphne.log()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield Console(f"http://127.0.0.1:{port}", browser, procs, providers_url)
        finally:
            browser.close()
            # Django keys connections by context variable, and Playwright's sync API gives this
            # block a context of its own: the connection the test's queries opened here is not
            # pytest-django's, and nobody else would close it before the database is dropped.
            connections.close_all()

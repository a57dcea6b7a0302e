"""A real browser (Debian's Chromium driven by Playwright) against daphne with websockets,
real workers and the simulated providers, all on the test database.

What is expensive to start is started once per test process (each xdist worker): one provider
server, one daphne and one Chromium, session-scoped, on that process's own test database and
Redis db. Each test gets what must not leak between tests: a fresh browser context per page
(cookies, storage, open websockets), its own worker processes (``procs``), its users, its
data. Between tests pytest-django empties every table (the providers' books included) and
tests/conftest.py flushes the Redis db; the shared servers keep no state of their own that
outlives that (daphne and the provider read users, sessions and faults from the database
for every request, and subscribe a page's websocket to its groups when it opens).

A test that must own its daphne (another environment, another Redis, a daphne it kills)
starts one with ``start_daphne`` and shares the rest (test_redis_outage.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connections

from operators import roles
from tests.procs import ROOT, Proc, Procs, start_providers, wait_until, worker_env

# Playwright's sync API marks its event loop as running in this thread between its calls (see
# `_playwright_loop`); Django's ORM calls from a test body are still synchronous and safe here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-artifacts" / "screenshots"
MODULES = ("tests.ledger.wf_sagas,tests.ledger.wf_orders,tests.sagas.wf_repair,tests.console.run_data,"
           "tests.sagas.wf_schedules")
PASSWORD = "correct-horse-battery"
# The backend a session names: the one that loads the user of a request. The form's login goes
# through axes' backend first, which authenticates nobody by itself (ModelBackend does).
SESSION_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(procs: Procs, env: dict[str, str], name: str = "daphne") -> tuple[Proc, str]:
    """A real daphne serving the console (config.asgi) on a free port; it and its base URL once
    it listens."""
    port = _free_port()
    daphne = procs.start(name, ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"], env)
    wait_until(lambda: "Listening on TCP address" in daphne.log() or not daphne.alive(), 30, what=name)
    assert daphne.alive(), daphne.log()
    return daphne, f"http://127.0.0.1:{port}"


def session_cookie(user, base: str) -> dict:
    """A logged-in session for ``user`` (what django.contrib.auth.login stores), as the cookie a
    browser context takes: the console's own login form is tested in test_csp.py and
    test_console_browser.py, the other tests start logged in."""
    from importlib import import_module

    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    store = import_module(django_settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = user._meta.pk.value_to_string(user)
    store[BACKEND_SESSION_KEY] = SESSION_BACKEND
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return {"name": django_settings.SESSION_COOKIE_NAME, "value": store.session_key, "url": base,
            "httpOnly": True, "sameSite": "Lax"}


def _no_dialog(dialog) -> None:
    raise AssertionError(f"a script ran: dialog {dialog.message!r}")


class Console:
    """The shared servers and browser as one test sees them. Every context it opens is closed
    after the test (``close``), so no page of one test is still live in the next."""

    def __init__(self, base: str, browser, procs, providers_url: str) -> None:
        self.base, self.browser, self.procs, self.providers_url = base, browser, procs, providers_url
        self.contexts: list = []

    def context(self, username: str | None = None, *, init_script: str | None = None, init_path: Path | None = None):
        """A new browser context (nothing shared with any other), logged in as ``username``
        by its session cookie (None: nobody)."""
        context = self.browser.new_context(base_url=self.base)
        self.contexts.append(context)
        if init_path is not None:
            context.add_init_script(path=str(init_path))
        if init_script is not None:
            context.add_init_script(init_script)
        if username is not None:
            user = get_user_model().objects.get(username=username)
            context.add_cookies([session_cookie(user, self.base)])
        return context

    def page(self, username: str, path: str | None = "/", *, via_form: bool = False):
        """A page of a new context, logged in as ``username``: by the session cookie, or by typing
        the login form (``via_form``); then on ``path`` (None: nowhere yet). Any dialog, which
        only a script could open, fails the test."""
        context = self.context(None if via_form else username)
        page = context.new_page()
        page.on("dialog", _no_dialog)
        if via_form:
            self.log_in(page, username)
            if path == "/":
                return page
        if path is not None:
            response = page.goto(path)
            assert "/login/" not in page.url, f"{username} is not logged in: {page.url}"
            assert response is not None and response.status == 200, f"{path}: {response and response.status}"
        return page

    @staticmethod
    def log_in(page, username: str) -> None:
        page.goto("/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/$"))

    def shot(self, page, name: str) -> Path:
        """A screenshot for people to look at (test-artifacts/screenshots/): an artifact, never
        an assertion."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def worker(self, name: str, **env: str):
        return self.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=self.providers_url, **env)

    def close(self) -> None:
        for context in self.contexts:
            try:
                context.close()
            except Exception:  # noqa: BLE001  (a test may have closed it, or the browser gone)
                pass
        self.contexts.clear()


@functools.lru_cache(maxsize=1)
def _password_hash() -> str:
    """Hashed once (the real hasher, which daphne's settings verify), shared by the users."""
    from django.contrib.auth.hashers import make_password

    return make_password(PASSWORD)


@pytest.fixture
def users(transactional_db):
    """The roles' users, made again for every test (the tables are emptied after each)."""
    roles.ensure_groups()
    made = {}
    for name, role in (("olga", "operator"), ("ann", "approver"), ("vic", "viewer"), ("sam", "operator")):
        user = get_user_model().objects.create(username=name, password=_password_hash())
        user.groups.add(Group.objects.get(name=role))
        made[name] = user
    return made


@dataclass
class Servers:
    providers_url: str
    base: str
    daphne: Proc
    providers: Proc
    procs: Procs


@pytest.fixture(scope="session")
def browser_servers(django_db_setup, django_db_blocker, tmp_path_factory):
    """One provider server and one daphne for this test process, on its test database (made by
    django_db_setup, which this waits for) and its Redis db; killed at the end of the session,
    before the test database is dropped."""
    procs = Procs(tmp_path_factory.mktemp("browser-servers"))
    try:
        with django_db_blocker.unblock():
            providers_url = start_providers(procs)
            daphne, base = start_daphne(procs, worker_env(MODULES, DEMO_PROVIDERS_URL=providers_url))
        yield Servers(providers_url, base, daphne, procs.procs[0], procs)
    finally:
        procs.stop_all()


_PLAYWRIGHT_LOOP: dict = {}


@pytest.fixture(scope="session")
def browser():
    """One Chromium for this test process; each test opens contexts of its own in it.

    Playwright's sync API marks its event loop as running in this thread after each of its
    calls. Left so between tests, every other test of this process would run "inside" an
    event loop: asyncio.run() and async_to_sync would refuse, and Django would key its
    connections differently. So the loop is marked running only while a browser test runs
    (``_playwright_loop``)."""
    from playwright.sync_api import sync_playwright

    manager = sync_playwright()
    pw = manager.start()
    try:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except BaseException:
        manager.__exit__()
        asyncio._set_running_loop(None)
        raise
    loop = _PLAYWRIGHT_LOOP["loop"] = manager._loop
    asyncio._set_running_loop(None)
    yield chromium
    asyncio._set_running_loop(loop)
    try:
        chromium.close()
    finally:
        manager.__exit__()
        asyncio._set_running_loop(None)


@pytest.fixture
def _playwright_loop(browser):
    """Playwright's loop marked running in this thread for the test, and not after it (see
    ``browser``). Test code between Playwright calls gets Django connections of its own then
    (as it did with a browser per test): they are closed here before the tables are emptied."""
    asyncio._set_running_loop(_PLAYWRIGHT_LOOP["loop"])
    try:
        yield
    finally:
        connections.close_all()
        asyncio._set_running_loop(None)


@pytest.fixture
def console(browser_servers, users, procs, settings, _playwright_loop, browser, request):
    settings.DEMO_PROVIDERS_URL = browser_servers.providers_url
    console = Console(browser_servers.base, browser, procs, browser_servers.providers_url)
    try:
        yield console
    finally:
        console.close()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(browser_servers.procs.logs())
        for proc in (browser_servers.daphne, browser_servers.providers):
            assert proc.alive(), f"the shared {proc.name} died during the test ({proc.popen.returncode}):\n{proc.log()[-6000:]}"

"""Console on a standby: with DATABASE_REPLICA_URL, daphne serves console pages from a streaming
standby, acts on the primary, says when the standby is behind, and reads the primary when the
standby is gone.

Its own servers, once per module: a private PostgreSQL primary (migrated), a hot standby of it
made with ``pg_basebackup -R``, and a daphne pointed at both. Requests are real HTTP requests to
that daphne with a session made on the primary. Replay on the standby is paused with
``pg_wal_replay_pause()`` to make "what the standby has" differ from "what the primary has".
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.cookiejar import Cookie, CookieJar

import pytest

from bench.servers import PostgresServer
from tests.browser.conftest import start_daphne
from tests.procs import Procs, run_python, wait_until, worker_env

MODULES = "tests.faults.wf_faults"
DB = "console"
NOTICE = "Showing data from a standby"
# The user, with the roles to read and to act, and a logged-in session for them, made on the
# primary by the product's own code.
SETUP = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import Group, User
from django.contrib.sessions.backends.db import SessionStore
from sagas.models import WorkflowRun
user = User.objects.create_user("ops", password="not-used-here")
user.groups.add(*(Group.objects.get_or_create(name=n)[0] for n in ("viewer", "operator")))
store = SessionStore()
store[SESSION_KEY] = str(user.pk)
store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
store[HASH_SESSION_KEY] = user.get_session_auth_hash()
store.save()
for key in ("order-early", "order-to-cancel"):
    WorkflowRun.objects.create(workflow_name="order", version=1, definition_hash="h", business_key=key)
print("SESSION", store.session_key)
"""


@dataclass
class Pair:
    primary: PostgresServer
    standby: PostgresServer
    base: str
    opener: urllib.request.OpenerDirector
    jar: CookieJar
    daphne_log: object

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def post(self, path: str, fields: dict[str, str]) -> tuple[int, str]:
        token = next(c.value for c in self.jar if c.name == "csrftoken")
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
        try:
            with self.opener.open(self.base + path, data=data, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def on(self, server: PostgresServer, sql: str) -> list[tuple]:
        with server.connect(DB) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def caught_up(self) -> None:
        """A commit on the primary (so the standby has a last-replayed time), then until the
        standby has replayed everything the primary wrote."""
        (lsn,) = self.on(self.primary, "SELECT txid_current(), pg_current_wal_lsn()::text")[0][1:]
        wait_until(lambda: self.on(self.standby, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0],
                   15, what="the standby to replay the primary's WAL")


@pytest.fixture(scope="module")
def pair(django_db_setup, tmp_path_factory):
    primary, standby = PostgresServer(), PostgresServer()
    procs = Procs(tmp_path_factory.mktemp("standby-logs"))
    try:
        primary.start()
        primary.create_database(DB)
        env = worker_env(MODULES, DATABASE_URL=primary.url(DB))
        done = run_python(["manage.py", "migrate", "--noinput", "-v", "0"], env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        done = run_python(["manage.py", "shell", "-c", SETUP], env=env, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        session = re.search(r"SESSION (\w+)", done.stdout).group(1)
        standby.start_standby_of(primary)
        daphne, base = start_daphne(procs, {**env, "DATABASE_REPLICA_URL": standby.url(DB)}, name="daphne-standby")
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        jar.set_cookie(Cookie(0, "sessionid", session, None, False, "127.0.0.1", False, False, "/", True, False,
                              None, False, None, None, {}))
        yield Pair(primary, standby, base, opener, jar, daphne.log)
    finally:
        procs.stop_all()
        standby.cleanup()
        primary.cleanup()


def _page_when(pair: Pair, path: str, wanted, what: str) -> str:
    """The page at ``path`` once ``wanted(page)`` (bounded: the lag is measured every 2 s)."""
    pages: list[str] = []
    wait_until(lambda: wanted(pages.append(pair.get(path)[1]) or pages[-1]), 10, interval=0.3, what=what)
    return pages[-1]


def _run_id(pair: Pair, key: str) -> str:
    return str(pair.on(pair.primary, f"SELECT id FROM sagas_workflowrun WHERE business_key = '{key}'")[0][0])


def test_it_lists_runs_from_the_standby_and_says_how_far_behind_it_is(pair):
    pair.caught_up()
    status, page = pair.get("/runs/")
    assert status == 200 and "order-early" in page and NOTICE not in page
    pair.on(pair.standby, "SELECT pg_wal_replay_pause()")
    try:
        # A run the primary has and the paused standby has not: a copy of one, under another key.
        pair.on(pair.primary, """
            CREATE TEMP TABLE late AS SELECT * FROM sagas_workflowrun WHERE business_key = 'order-early';
            UPDATE late SET id = gen_random_uuid(), business_key = 'order-late';
            INSERT INTO sagas_workflowrun SELECT * FROM late;
        """)
        # The standby's lag is measured at most every 2 s: until then the page has no notice.
        page = _page_when(pair, "/runs/", lambda p: NOTICE in p, "the page to say the standby is behind")
        assert re.search(NOTICE + r" \d+ s behind", page)
        assert "order-early" in page and "order-late" not in page
    finally:
        pair.on(pair.standby, "SELECT pg_wal_replay_resume()")
    _page_when(pair, "/runs/", lambda p: "order-late" in p and NOTICE not in p,
               "the late run on the list, without the notice, once the standby replays")


def test_it_acts_on_the_primary_while_the_standby_lags(pair):
    pair.caught_up()
    run_id = _run_id(pair, "order-to-cancel")
    status, page = pair.get(f"/runs/{run_id}/")  # the form (and the CSRF cookie)
    assert status == 200 and 'name="expected" value="PENDING"' in page
    pair.on(pair.standby, "SELECT pg_wal_replay_pause()")
    try:
        status, page = pair.post(f"/runs/{run_id}/cancel/", {"reason": "customer called", "expected": "PENDING"})
        # The page the action redirects to: read from the primary (this browser has just acted), so
        # it shows the cancel the standby has not replayed, under the action's notice.
        assert status == 200 and "Run cancelled." in page
        assert '<span class="badge CANCELLED">CANCELLED</span>' in page
        primary = pair.on(pair.primary, f"SELECT status FROM sagas_workflowrun WHERE id = '{run_id}'")
        standby = pair.on(pair.standby, f"SELECT status FROM sagas_workflowrun WHERE id = '{run_id}'")
        assert (primary, standby) == ([("CANCELLED",)], [("PENDING",)])
        audited = pair.on(pair.primary, "SELECT reason FROM console_auditentry WHERE action = 'run.cancel'")
        assert audited == [("customer called",)]
        # The same action again checks the state on the primary (CANCELLED), not the standby's.
        status, page = pair.post(f"/runs/{run_id}/cancel/", {"reason": "again", "expected": "PENDING"})
        assert status == 409
        # Ten seconds on (its read-your-writes cookie gone), this browser reads the lagging standby again.
        pair.jar.clear("127.0.0.1", "/", "saga_primary")
        status, page = pair.get(f"/runs/{run_id}/")
        assert status == 200 and '<span class="badge PENDING">PENDING</span>' in page
        # Exports too: the audit CSV (streamed after its view returned) has not the cancel yet.
        status, csv = pair.get("/audit.csv")
        assert status == 200 and "run.cancel" not in csv
    finally:
        pair.on(pair.standby, "SELECT pg_wal_replay_resume()")
    pair.caught_up()
    assert "customer called" in pair.get("/audit.csv")[1]  # once the standby has it


def test_it_reads_the_primary_when_the_standby_is_down(pair):
    pair.caught_up()
    pair.standby.stop("immediate")
    started = time.monotonic()
    for path in ("/runs/", "/runs/", "/audit/", "/"):
        status, page = pair.get(path)
        assert status == 200, page[-2000:]
        assert NOTICE not in page
    assert "order-late" in pair.get("/runs/")[1]
    assert time.monotonic() - started < 8  # the first page waits at most the pool's 3 s for the standby
    assert pair.daphne_log().count("PostgreSQL standby unreachable") == 1

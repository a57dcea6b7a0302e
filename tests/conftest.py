from __future__ import annotations

import json
import os
import time

import pytest
from django.db import connection

from tests.procs import BENCH_SHARED, Procs, SharedProviders

# `make test` runs on pytest-xdist workers (addopts in pyproject.toml: -n auto --dist loadgroup).
# Each worker has its own test database and Redis database (config/settings_test.py); what
# tests share beyond those is kept to one worker by an xdist_group below.
# Three on the 2-core machine: the tests mostly wait (processes starting, leases expiring,
# polling), so a third worker fills the idle time. tests/ledger, tests/agents and tests/api
# (133 tests) took 343 s of wall time on 2 workers and 266 s on 3, with the same CPU time
# (2026-12-04, a machine shared with other suites). Not four: with the failover, PgBouncer and
# partition fault tests the cores were 90 % busy on three, and four took longer in a clean clone
# (799 s against 767 s, 2026-12-08) with a live-page browser test failing under the load.
WHOLE_SUITE_WORKERS = 3


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the dev extra)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: the whole suite (pytest given no path) on WHOLE_SUITE_WORKERS processes, a
    selection of tests in this process (each worker migrates a test database of its own first,
    which a few tests do not earn back). ``-n N`` or PYTEST_XDIST_AUTO_NUM_WORKERS=N decide
    otherwise; TEST_REDIS_URL names one Redis database, so one process."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if "TEST_REDIS_URL" in os.environ or config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return 0
    return WHOLE_SUITE_WORKERS


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests that may not run in two workers at once share an xdist_group (one worker runs a
    group's tests one after another; --dist loadgroup hands out the largest groups first):

    * the benchmark smokes: they use the saga_bench* databases, Redis dbs 1 and 10-14 and the
      virtualenvs under .bench/, never a test session's own. Two groups, which share none of
      these, so the smokes run on two workers and still never two on one resource at once:
      BENCH_SHARED (the smokes on saga_bench and Redis 14, which each empties, and with them
      continue_loop on Redis 12, which bench/engine.py runs too, and agents, which uses the
      other .bench/ virtualenv) and BENCH_OWN (faults and retention on private servers,
      retention and bulk on Redis 11, api on Redis 1). tests/bench marks the second group;
      an unmarked smoke joins the first;
    * the tests of a module with a module-scoped fixture (a private PostgreSQL server, a
      deployment): split across workers, each would build it again.

    tryfirst: pytest-xdist's worker names the group in each node id (``<id>@<group>``) in its
    own pytest_collection_modifyitems, which must see these marks. That suffix is read by
    pytest up to 9.1 (pyproject.toml pins pytest below 9.2 for this reason)."""
    items[:] = _interleaved(items, config.rootpath)
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        if path.startswith("tests/bench/"):
            if not any(item.iter_markers("xdist_group")):
                item.add_marker(pytest.mark.xdist_group(BENCH_SHARED))
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures is not None else ()
        if any(fixturedef.scope in ("module", "package") for chain in defs for fixturedef in chain):
            item.add_marker(pytest.mark.xdist_group(path))


def _interleaved(items: list, root) -> list:
    """The modules of tests/<area>/ taken in turns, one module of each area after another (a
    module's tests stay together and in order). xdist hands ungrouped tests out in this order:
    in path order the browser, security and demo modules, which keep both cores busy, all came in
    the first half, and ledger, sagas and faults, which mostly wait for leases and processes, in
    the second, where the two cores were 50 to 75 % busy (2026-12-07, 580.6 s)."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.path.relative_to(root).as_posix(), []).append(item)
    areas: dict[str, list[list]] = {}
    for path, tests in modules.items():
        areas.setdefault(path.split("/")[1] if path.count("/") > 1 else "", []).append(tests)
    ordered: list = []
    queues = list(areas.values())
    while queues:
        for queue in queues:
            ordered.extend(queue.pop(0))
        queues = [queue for queue in queues if queue]
    return ordered


@pytest.fixture(scope="session", autouse=True)
def _no_session_left_at_the_end(django_db_setup, django_db_blocker):
    """Before the test database is dropped, wait for the PostgreSQL sessions of processes the
    tests killed to end. A SIGKILLed worker's backend notices its client is gone a moment
    later; dropping the database in that moment failed with "being accessed by other
    users". Whatever is still connected after 10 s is named here, then ended."""
    yield
    if not connection.settings_dict["NAME"].startswith("test_"):
        return  # no selected test used the database: pytest-django never created it
    with django_db_blocker.unblock(), connection.cursor() as cur:
        others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        for _ in range(200):
            cur.execute(f"SELECT count(*) {others}")
            if cur.fetchone()[0] == 0:
                return
            time.sleep(0.05)
        cur.execute(f"SELECT pid, application_name, client_port, state, left(query, 80) {others}")
        for row in cur.fetchall():
            print(f"a session outlived the tests: {row}")
        cur.execute(f"SELECT pg_terminate_backend(pid) {others}")


@pytest.fixture(autouse=True)
def _clean_redis():
    """Each test starts with an empty Redis database (the tests' own, see settings_test)."""
    from sagas.runtime.queue import drop_wakeups_due_later, redis_connection

    drop_wakeups_due_later()  # an earlier test's, sent a moment after its commit (SAGAS_DISPATCH_RQ_DELAY)
    redis_connection().flushdb()
    yield


@pytest.fixture
def procs(tmp_path, request):
    """Spawns real worker processes; kills them all (SIGKILL) after the test."""
    group = Procs(tmp_path)
    yield group
    group.stop_all()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(group.logs())


@pytest.fixture(scope="session")
def _session_providers(django_db_setup, tmp_path_factory):
    """The session's ``demo_providers`` process (``tests.procs.SharedProviders``), started
    when a test first asks for ``providers_url``, stopped before the test database is dropped."""
    shared = SharedProviders(tmp_path_factory.mktemp("providers"))
    yield shared
    shared.stop()


@pytest.fixture
def providers_url(_session_providers, transactional_db, settings, request):
    """The URL of the session's simulated providers (a real ``demo_providers`` process on this
    test database), set as DEMO_PROVIDERS_URL for this process's connectors. Transactional:
    the providers see only committed rows, and their books are emptied after each test."""
    url = _session_providers.for_a_test()
    # Emptied by the last test's flush, but a request of its killed workers that was still in
    # flight then (now done: for_a_test waited) may have written after it.
    from demo.models import ProviderExecution, ProviderFault, ProviderReplay, WebhookArrival

    with connection.cursor() as cur:
        for model in (ProviderReplay, ProviderExecution, ProviderFault, WebhookArrival):
            cur.execute(f"DELETE FROM {model._meta.db_table}")
    settings.DEMO_PROVIDERS_URL = url
    offset = _session_providers.log_offset()
    yield url
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"----- shared providers (from this test on) -----\n{_session_providers.log_since(offset)[-6000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def step_calls(transactional_db):
    """A table where test steps count their real executions (survives worker kills)."""
    with connection.cursor() as cur:
        cur.execute(
            """CREATE TABLE IF NOT EXISTS test_step_calls (
                   id bigserial PRIMARY KEY, run_id text NOT NULL, step text NOT NULL,
                   pid int NOT NULL, payload jsonb, at timestamptz NOT NULL DEFAULT clock_timestamp())"""
        )
        cur.execute("DELETE FROM test_step_calls")  # a few rows: cheaper than TRUNCATE's new files
    return StepCalls()


class StepCalls:
    def counts(self, run_id) -> dict[str, int]:
        with connection.cursor() as cur:
            cur.execute("SELECT step, count(*) FROM test_step_calls WHERE run_id = %s GROUP BY step", [str(run_id)])
            return dict(cur.fetchall())

    def rows(self, run_id, step: str) -> list[tuple]:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid, payload, at FROM test_step_calls WHERE run_id = %s AND step = %s ORDER BY id",
                [str(run_id), step],
            )
            return [(pid, json.loads(payload) if payload else None, at) for pid, payload, at in cur.fetchall()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``SAGA_TEST_TIMELINE=<file>``: each test's xdist worker, start and end (epoch seconds)
    and node id appended to the file, one line a test: to see how the workers' time is spent
    and which of them finishes last (``make test`` is held to 10 minutes on 2 cores)."""
    path = os.environ.get("SAGA_TEST_TIMELINE")
    started = time.time()
    try:
        return (yield)
    finally:
        if path:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(path, "a") as out:
                out.write(f"{worker} {started:.2f} {time.time():.2f} {item.nodeid}\n")

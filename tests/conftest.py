from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.procs import Procs


@pytest.fixture(autouse=True)
def _clean_redis():
    """Each test starts with an empty Redis database (the tests' own, see settings_test)."""
    from sagas.queue import redis_connection

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
        cur.execute("TRUNCATE test_step_calls")
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

"""Our PostgreSQL sessions turn off the planner features meant for long queries: JIT
compilation and parallel workers. Both made the console's pages slower at 10M runs (a count
compiling for 7 of its 11 ms; the run list's sorted search taking 22 to 26 ms with two parallel
workers against 12.7 without), and both are set through the connection's startup options, so
every process (web, workers, sweeper, management commands) has them."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_our_sessions_run_without_jit_and_without_parallel_workers():
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('jit'), current_setting('max_parallel_workers_per_gather')")
        assert cur.fetchone() == ("off", "0")


def test_a_transaction_pooler_without_a_direct_url_stops_the_process_at_start_up():
    """DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL (LISTEN and session locks need a
    session): without it a process refuses to start and says why, rather than a sweeper whose
    lock is never released or a worker that never hears a run."""
    import os

    from tests.procs import run_python

    env = {**os.environ, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_POOLER": "transaction"}
    env.pop("DATABASE_DIRECT_URL", None)
    done = run_python(["manage.py", "check"], env=env, timeout=60)
    assert done.returncode != 0
    assert "DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL" in done.stderr, done.stderr[-2000:]
    typo = run_python(["manage.py", "check"], env={**env, "DATABASE_POOLER": "transactions"}, timeout=60)
    assert typo.returncode != 0 and "must be session or transaction" in typo.stderr, typo.stderr[-2000:]

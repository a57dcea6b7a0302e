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

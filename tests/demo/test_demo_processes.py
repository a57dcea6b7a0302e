"""The demo's processes: one demo per run directory, and a load generator that outlives
PostgreSQL and Redis outages. Real ``manage.py demo`` processes, real SIGKILLs, and private
PostgreSQL and Redis servers stopped and started again (never the shared ones). The providers'
restart on their one address and the terminated database connection are watched in the product
demo's one run (``test_demo_command.py``)."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import UTC, datetime

from bench.servers import PostgresServer, RedisServer
from tests.demo.demoproc import http_status, running
from tests.procs import wait_until

# A product demo that keeps running until the test stops it, with no worker kills of its own.
KEEP_RUNNING = ("--port", "0", "--kill-every", "0", "--duration", "600")
CHILDREN = {"providers", "daphne", "worker-1", "worker-2", "sweeper", "reconciler"}
ORDERS = "SELECT count(*) FROM sagas_workflowrun WHERE workflow_name = 'order_agent'"


def started_and_serving(demo) -> str:
    """Wait for ``demo`` to print its console's URL; the URL."""
    wait_until(lambda: demo.url() or demo.popen.poll() is not None, 120, interval=0.2,
               what=f"{demo.out_path.name} to print the console's URL")
    assert demo.popen.poll() is None, demo.output()
    assert set(demo.started()) == CHILDREN, demo.output()
    return demo.url()


def test_it_refuses_a_second_demo_starts_over_the_lock_of_a_killed_one_and_pauses_the_load_through_outages(demos):
    """One sequence on private servers, so the suite starts two demos here, not three: a second
    demo in the same run directory is refused and leaves the first running; the first is then
    SIGKILLed (only itself: its children keep running) and a third starts over its lock, stopping
    what it left, with the same logins, completing orders through its own providers. Its load then
    pauses while PostgreSQL is stopped, and again while Redis is, saying so once when each outage
    starts and once when it ends, and resumes by itself; a SIGTERM stops it and everything it
    started."""
    pg, redis_server = PostgresServer(), RedisServer()
    first = second = new = None
    try:
        pg.start()
        redis_server.start()
        servers = dict(DATABASE_URL=pg.url("saga_demo"), REDIS_URL=redis_server.url(0))

        def orders(*, completed_since: datetime | None = None) -> int:
            query, params = ORDERS, []
            if completed_since is not None:
                query += " AND status = 'COMPLETED' AND created_at > %s"
                params.append(completed_since)
            with pg.connect("saga_demo") as conn:
                return conn.execute(query, params).fetchone()[0]

        first = demos("first")
        first.start(*KEEP_RUNNING, **servers)
        url = started_and_serving(first)
        children = first.started()

        second = demos("second")
        second.start(*KEEP_RUNNING, **servers)
        code = second.popen.wait(timeout=90)
        refused_at = datetime.now(UTC)
        said = second.output()
        assert code != 0, said
        assert "a demo is already running" in said and url in said and f"pid {first.popen.pid}" in said, said
        assert not re.search(r"^  started |killed|migrated", said, re.M), said  # it did nothing

        # The first demo did not notice: same processes, nothing exited or restarted, and it still
        # serves the console and completes new orders (its workers still reach its providers).
        assert first.popen.poll() is None, first.output()
        for name, pid in children.items():
            assert running(pid), f"{name} (pid {pid}) of the first demo is gone"
        assert first.started() == children
        assert "exited with status" not in first.output() and "restarted" not in first.output()
        assert http_status(url + "login/") in (200, 302)
        wait_until(lambda: orders(completed_since=refused_at) > 0, 90, interval=0.5,
                   what="the first demo to complete an order started after the second was refused")

        # Now the first demo dies by itself: what it started keeps running, its lock names a dead pid.
        left = first.started()
        os.kill(first.popen.pid, signal.SIGKILL)
        first.popen.wait(timeout=10)
        assert all(running(pid) for pid in left.values())
        state = (first.run_dir / "demo-state.json").read_text()
        assert f'"pid": {first.popen.pid}' in state  # what it left behind names a dead process

        logins = re.findall(r"log in as .*", first.output())
        assert len(logins) == 3
        new = demos("new")
        new.start(*KEEP_RUNNING, **servers)
        url = started_and_serving(new)
        out = new.output()
        assert "already running" not in out
        assert re.findall(r"log in as .*", out) == logins  # the same run directory: the same people
        for name, pid in left.items():
            assert f"killed {name} (pid {pid}), left running by an earlier demo" in out, out
            wait_until(lambda pid=pid: not running(pid), 10, what=f"{name} of the killed demo to be gone")
        assert http_status(url + "login/") in (200, 302)
        serving_since = datetime.now(UTC)
        wait_until(lambda: orders(completed_since=serving_since) > 0, 90, interval=0.5,
                   what="the new demo to complete an order")

        # The new demo's load through a PostgreSQL outage, then a Redis one.
        before = orders()
        for what, server in (("PostgreSQL", pg), ("Redis", redis_server)):
            wait_until(lambda: orders() >= before + 3, 60, interval=0.5, what=f"orders before the {what} outage")
            server.stop()
            wait_until(lambda: f"storage outage: {what} unreachable" in new.output(), 30, interval=0.2,
                       what=f"the demo to notice {what} is gone")
            time.sleep(5)  # a few backoffs
            server.start()
            before = orders()
            back = rf"storage outage over: {what} answers again after ([\d.]+) s"
            found = wait_until(lambda: re.search(back, new.output()), 30, interval=0.2,
                               what=f"the demo to notice {what} is back")
            assert float(found.group(1)) >= 5
            wait_until(lambda: orders() >= before + 3, 60, interval=0.5, what=f"orders after the {what} outage")
            out = new.output()  # the demo's terminal: one line when it starts, one when it ends
            assert out.count(f"storage outage: {what} unreachable") == 1, out
            assert out.count(f"storage outage over: {what} answers again") == 1, out
            assert new.popen.poll() is None, out

        os.kill(new.popen.pid, signal.SIGTERM)
        assert new.popen.wait(timeout=60) == 0, new.output()
        assert "SIGTERM: stopping every process the demo started" in new.output()
        for pid in new.child_pids():
            assert not running(pid)
    finally:
        for demo in (first, second, new):  # before their servers go (the fixture kills them again)
            if demo is not None:
                demo.kill_everything()
        pg.cleanup()
        redis_server.cleanup()

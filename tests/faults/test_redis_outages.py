"""Redis stopped for 20 s under real workers and a client starting runs.

Redis only carries wake-ups: while it is down, ``start()`` still commits the run in
PostgreSQL and returns, workers keep their process and reconnect by themselves, a worker
with a free fast thread takes a new run from PostgreSQL's announcement (no Redis on that
path), and once Redis is back the sweeper enqueues every run that no queue holds.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import assert_one_outage_logged
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE = 20.0


def test_it_starts_and_completes_every_run_across_a_redis_outage(faults):
    w1 = faults.worker("w1", "--concurrency", "2")
    w2 = faults.worker("w2", "--concurrency", "2")
    faults.workers_ready(w1, w2)
    driver = faults.driver()
    before = [driver.start_ok("ticks", {"steps": 8, "pause": 0.3}) for _ in range(4)]
    wait_until(lambda: len(faults.calls()) >= 4, 30, what="runs to be under way")
    marks = {w.name: len(w.log()) for w in (w1, w2)}

    faults.redis.stop()
    down_at = time.monotonic()
    during = []
    while time.monotonic() - down_at < OUTAGE:
        answer = driver.start("ticks", {"steps": 3, "pause": 0.1}, timeout=60)
        assert answer["ok"], f"start() raised while Redis was down: {answer}"
        during.append(answer)
        time.sleep(2.0)
    waiting = faults.db.statuses([a["run_id"] for a in during])
    faults.redis.start()
    back = time.time()
    runs = before + [a["run_id"] for a in during]
    after = faults.wait_completed(runs, 120, since=back)
    time.sleep(2.0)  # the background threads notice the end too
    slowest = max(a["seconds"] for a in during)
    print(f"\nRedis down {OUTAGE:g}s: {len(during)} start() calls meanwhile, slowest {slowest:.2f}s; "
          f"all {len(runs)} runs completed {after:.2f}s after Redis was back")

    # None failed or was lost: each waits (PENDING) for Redis, or was taken by a fast thread on
    # its commit's announcement, which needs no Redis; with a 2 s pace most find one free.
    assert set(waiting) <= {"PENDING", "RUNNING", "COMPLETED"}, f"runs started without Redis: {waiting}"
    assert sum(waiting.values()) == len(during), waiting
    assert waiting.get("COMPLETED", 0) >= 1, f"no run went by the fast path while Redis was down: {waiting}"
    assert w1.alive() and w2.alive(), "a worker died with Redis"
    assert faults.repeated_steps() == {}
    for w in (w1, w2):
        log = w.log()[marks[w.name]:]
        assert_one_outage_logged(w.name, log)


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_it_stops_on_sigterm_while_redis_is_down(faults, concurrency):
    """An operator stops workers during a Redis outage (or a deploy overlaps one). The
    worker's goodbye to RQ fails on the dead connection; that must not be taken for one
    more outage to wait out: SIGTERM stops the worker promptly, with its runs safe in
    PostgreSQL."""
    import signal

    worker = faults.worker("w1", "--concurrency", concurrency)
    faults.workers_ready(worker)
    driver = faults.driver()
    faults.wait_completed([driver.start_ok("ticks", {"steps": 2})], 60)
    faults.redis.stop()
    wait_until(lambda: "storage outage: Redis unreachable" in worker.log(), 30, what="the worker to notice")
    worker.signal(signal.SIGTERM)
    stopped = time.monotonic()
    wait_until(lambda: not worker.alive(), 20, what="the worker to stop on SIGTERM while Redis is down")
    print(f"\n--concurrency {concurrency}: stopped {time.monotonic() - stopped:.2f}s after SIGTERM, Redis down")
    faults.redis.start()

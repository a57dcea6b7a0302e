"""PostgreSQL failing over under load: a pg_auto_failover formation (a monitor, a primary and a
synchronous secondary: Debian's postgresql-15-auto-failover), 1,000 runs with two provider
effects each (a capture the provider dedupes, an email it does not), started by a client as the
backlog drains (so starts meet the failovers too), and the primary killed twice (its keeper SIGKILLed, its PostgreSQL stopped with
``-m immediate``); the killed node rejoins as the secondary between the two.

Every process (workers, the client starting runs) has the formation's multi-host URL
(``target_session_attrs=read-write``) and nothing else: after each failover its next connection
finds the new primary. With synchronous replication nothing the engine was told is committed
is lost, so: every run started exists and completes, no provider executes anything twice, no
step runs twice, no run is failed or put to an operator.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from bench.autofailover import AutoFailover
from bench.servers import PostgresServer, RedisServer
from tests.faults.conftest import LEASE_TTL, MODULES, WRONG_STATUSES, Driver
from tests.faults.test_postgres_outages import provider_executions
from tests.procs import Procs, run_python, start_providers, wait_until, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 1000
EFFECTS_PER_RUN = 2
CHUNK = 50  # runs the client starts at a time, whenever fewer than BACKLOG wait
BACKLOG = 120
DURING = 20  # runs a second client starts one by one from just before each kill: starts meet the failover


@pytest.fixture
def formation(django_db_setup):
    paf, redis_server = AutoFailover("faults_failover"), RedisServer()
    try:
        paf.start()
        redis_server.start()
        yield paf, redis_server
    finally:
        paf.cleanup()
        redis_server.cleanup()


def _rows(paf: AutoFailover, sql: str, params=(), timeout: float = 60) -> list[tuple]:
    """A query on whichever node is the primary now, waiting out a failover."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with paf.connect() as conn:
                return conn.execute(sql, params).fetchall()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _statuses(paf: AutoFailover) -> Counter:
    return Counter(dict(_rows(paf, "SELECT status, count(*) FROM sagas_workflowrun GROUP BY status")))


def _first_step_after(paf: AutoFailover, epoch: float) -> float:
    """Seconds from ``epoch`` to the first step a worker journaled after it (on the new primary)."""
    rows = _rows(paf, "SELECT extract(epoch FROM min(created_at))::float8 FROM sagas_journalentry "
                      "WHERE kind = 'step' AND created_at > to_timestamp(%s)", [epoch])
    return rows[0][0] - epoch


def test_two_failovers_under_load_lose_repeat_and_fail_nothing(formation, procs: Procs, tmp_path):
    paf, redis_server = formation
    calls = tmp_path / "calls.log"
    calls.touch()
    env = worker_env(MODULES, DATABASE_URL=paf.uri(), REDIS_URL=redis_server.url(),
                     DEMO_PROVIDERS_URL=start_providers(procs), SAGAS_LEASE_TTL=LEASE_TTL, FAULTS_CALLS=str(calls))
    done = run_python(["manage.py", "migrate", "--noinput", "-v", "0"], env=env, timeout=240)
    assert done.returncode == 0, f"migrate through the multi-host URL failed:\n{done.stdout}{done.stderr}"
    workers = [procs.start(f"w{i}", ["manage.py", "sagas_worker", "--name", f"w{i}", "--concurrency", "4"], env)
               for i in (1, 2)]
    for w in workers:
        wait_until(lambda w=w: "sagas worker " in w.log() or not w.alive(), 60, what=f"{w.name} to start")
    driver = Driver(procs, env)

    started: dict = {"run_ids": [], "errors": [], "ok": True}

    def client() -> None:
        for first in range(0, RUNS - 2 * DURING, CHUNK):
            wait_until(lambda: _statuses(paf).get("PENDING", 0) < BACKLOG, 300, interval=0.2, what="the backlog")
            keys = [f"fo-{i}" for i in range(first, min(first + CHUNK, RUNS - 2 * DURING))]
            answer = driver.start_many("failover_order", [{"id": key} for key in keys], keys, retry_for=120)
            started["run_ids"] += answer["run_ids"]
            started["errors"] += answer["errors"]
            if not answer["ok"]:
                started["ok"] = False
                return

    client_thread = threading.Thread(target=client, daemon=True)
    client_thread.start()
    second = Driver(procs, env, name="driver-during")

    def start_during(failover: int) -> threading.Thread:
        def go() -> None:
            for j in range(DURING):
                key = f"ff-{failover}-{j}"
                answer = second.start_many("failover_order", [{"id": key}], [key], retry_for=120)
                started["run_ids"] += answer["run_ids"]
                started["errors"] += answer["errors"]
                started["ok"] = started["ok"] and answer["ok"]
                time.sleep(0.25)
        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread

    failovers = []
    for completed_before in (RUNS // 4, RUNS * 3 // 5):
        wait_until(lambda n=completed_before: _statuses(paf).get("COMPLETED", 0) >= n, 240, interval=0.2,
                   what=f"{completed_before} runs to complete")
        in_flight = _statuses(paf)
        during = start_during(len(failovers))
        time.sleep(0.5)
        old = paf.kill_primary()
        killed_at = time.time()  # its PostgreSQL has stopped (-m immediate returned)
        new = paf.wait_new_primary(old)
        writable = time.time() - killed_at
        wait_until(lambda at=killed_at: _rows(paf, "SELECT count(*) FROM sagas_journalentry WHERE kind = 'step' "
                                                   "AND created_at > to_timestamp(%s)", [at])[0][0] > 0,
                   60, interval=0.1, what="a step journaled on the new primary")
        failovers.append({"killed": old.name, "promoted": new.name, "in_flight": dict(in_flight),
                          "writable_s": round(writable, 2), "first_step_s": round(_first_step_after(paf, killed_at), 2)})
        during.join(180)
        if len(failovers) == 1:
            paf.rejoin(old)  # back as the secondary: the second kill has somewhere to fail over to

    client_thread.join(600)
    assert started.get("ok"), f"the client could not start every run: {started.get('errors', [])[-5:]}"
    run_ids = started["run_ids"]
    wait_until(lambda: _statuses(paf).get("COMPLETED", 0) == RUNS or bool(WRONG_STATUSES & set(_statuses(paf))),
               300, interval=0.5, what=f"{RUNS} runs to settle")
    statuses = _statuses(paf)
    started_errors = len(started["errors"])
    settled_at = _rows(paf, "SELECT extract(epoch FROM max(finished_at))::float8 FROM sagas_workflowrun")[0][0]
    last_kill = killed_at
    print(f"\npg_auto_failover, {RUNS} runs x {EFFECTS_PER_RUN} effects, 2 workers x 4:")
    for f in failovers:
        print(f"  {f['killed']} killed with {f['in_flight']}: {f['promoted']} writable {f['writable_s']} s after "
              f"the kill, first step on it {f['first_step_s']} s after")
    print(f"  client: {started_errors} start attempts failed and were sent again; the last run "
          f"finished {settled_at - last_kill:.1f} s after the second kill; {dict(statuses)}")

    assert len(set(run_ids)) == RUNS, "a start the client was told succeeded is missing a run"
    assert _rows(paf, "SELECT count(*) FROM sagas_workflowrun WHERE id = ANY(%s::uuid[])", [run_ids])[0][0] == RUNS, (
        "a run the client was given is gone from the new primary")
    assert statuses == Counter({"COMPLETED": RUNS}), f"runs not completed (lost or wrongly failed): {dict(statuses)}"
    assert all(f["in_flight"].get("COMPLETED", 0) < RUNS for f in failovers), "a failover hit no run in flight"
    executions = provider_executions()
    assert {key: n for key, n in executions.items() if n != 1} == {}, "a provider executed something twice"
    assert len(executions) == EFFECTS_PER_RUN * RUNS, "an effect of a completed run never reached its provider"
    lines = [line.split()[:2] for line in calls.read_text().splitlines() if line.strip()]
    repeated = {key: n for key, n in Counter(map(tuple, lines)).items() if n != 1}
    assert repeated == {}, f"journaled steps ran again: {list(repeated.items())[:5]}"
    assert all(w.alive() for w in workers), "a worker died in a failover"
    assert started_errors > 0, "no start met a failover: the client's retry was not exercised"


@pytest.mark.parametrize("claim", ["replicated", "lost"])
def test_a_failover_that_loses_acknowledged_entries_stops_the_run_and_makes_its_effects_unknown(claim, procs: Procs,
                                                                                                tmp_path):
    """Asynchronous replication: the standby stops receiving WAL while a run captures a payment
    and sends an email on the primary, then the primary crashes and the standby is promoted.
    The worker, still holding the run, reaches the new primary and finds its journal shorter
    than what it was told was written. Going on would replay the lost steps and take the lost
    effects for never asked; it stops the run instead (NEEDS_ATTENTION, ``journal_gap``) with
    both effects UNKNOWN, each executed once at its provider and not again.

    ``claim``: the worker's claim of the run reached the standby (its next entry is numbered
    below one it was told was written), or was lost with the rest (the run's fence on the new
    primary is below the worker's: the run is fenced past it and stopped the same way)."""
    primary, standby, redis_server = PostgresServer(), PostgresServer(), RedisServer()
    try:
        primary.start()
        redis_server.start()
        primary.create_database("faults_gap")
        url = (f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/faults_gap"
               f"?target_session_attrs=read-write")
        env = worker_env(MODULES, DATABASE_URL=url, REDIS_URL=redis_server.url(),
                         DEMO_PROVIDERS_URL=start_providers(procs), SAGAS_LEASE_TTL=LEASE_TTL,
                         FAULTS_CALLS=str(tmp_path / "calls.log"))
        done = run_python(["manage.py", "migrate", "--noinput", "-v", "0"], env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        standby.start_standby_of(primary)  # asynchronous: the primary waits for no standby
        run_id = Driver(procs, env).start_ok("gap_order", {"id": "gap-1", "pause": 0.3, "after": 12})

        def kinds(server: PostgresServer) -> list[tuple[str, str]]:
            with server.connect("faults_gap") as conn:
                return conn.execute("SELECT kind, name FROM sagas_journalentry WHERE run_id = %s ORDER BY seq",
                                    [run_id]).fetchall()

        def cut_replication() -> None:  # the standby receives nothing more
            with standby.connect() as conn:
                conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
                conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: not standby.connect().execute("SELECT 1 FROM pg_stat_wal_receiver").fetchall(), 30,
                       what="the standby's WAL receiver to stop")

        wait_until(lambda: ("started", "") in kinds(standby), 60, interval=0.05, what="the run on the standby")
        if claim == "lost":
            cut_replication()
        worker = procs.start("w1", ["manage.py", "sagas_worker", "--name", "w1"], env)
        wait_until(lambda: "sagas worker " in worker.log() or not worker.alive(), 60, what="the worker to start")
        if claim == "replicated":
            wait_until(lambda: ("step", "prepare") in kinds(standby), 60, interval=0.05, what="prepare on the standby")
            cut_replication()
        wait_until(lambda: ("step", "after1") in kinds(primary), 60, interval=0.05,
                   what="the run to capture, email and go on, on the primary alone")
        acknowledged = kinds(primary)
        primary.stop("immediate")
        standby._run("pg_ctl", "promote", "-w", "-D", str(standby.data))
        promoted_at = time.time()

        def parked() -> bool:
            with standby.connect("faults_gap") as conn:
                return conn.execute("SELECT status FROM sagas_workflowrun WHERE id = %s",
                                    [run_id]).fetchone()[0] in WRONG_STATUSES | {"COMPLETED"}
        wait_until(parked, 60, interval=0.1, what="the worker to find the gap")
        with standby.connect("faults_gap") as conn:
            status, reason, error = conn.execute(
                "SELECT status, status_reason, error FROM sagas_workflowrun WHERE id = %s", [run_id]).fetchone()
            effects = dict(conn.execute("SELECT step_name, status FROM ledger_effectrecord WHERE run_id = %s",
                                        [run_id]).fetchall())
            after = conn.execute("SELECT kind, name FROM sagas_journalentry WHERE run_id = %s ORDER BY seq",
                                 [run_id]).fetchall()
        lost = [entry for entry in acknowledged if entry not in after]
        print(f"\nasynchronous failover: {len(lost)} acknowledged entries lost ({lost[:4]}...); the worker stopped "
              f"the run {time.time() - promoted_at:.1f} s after the promotion: {status} {reason}; effects {effects}")

        assert ("effect_intent", "email") in lost, "the failover lost nothing: the test did not test a gap"
        assert (("claimed", "") in lost) == (claim == "lost"), lost
        assert (status, reason) == ("NEEDS_ATTENTION", "journal_gap"), (status, reason, error, worker.log()[-3000:])
        assert error["lost_to"] >= error["lost_from"], error
        assert {e["name"] for e in error["effects"]} >= {"capture", "email"}, error["effects"]
        assert effects == {"capture": "UNKNOWN", "email": "UNKNOWN"}, "an effect in the gap was taken as not executed"
        executions = {(p, op): n for (p, op, _key), n in provider_executions().items()}
        assert executions == {("payments", "capture"): 1, ("email", "send"): 1}, executions
        assert after[-1][0] == "halted", after[-3:]
        assert worker.alive()
    finally:
        primary.cleanup()
        standby.cleanup()
        redis_server.cleanup()

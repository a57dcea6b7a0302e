"""PostgreSQL restarts, crashes and dropped connections under real workers.

None of them is a workflow's failure: every run completes, nothing runs twice at the
providers (whose books are on the shared test database, which is not restarted), no
run is FAILED, and new work is picked up within seconds of the server being back.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from demo.models import ProviderExecution
from demo.providers.faults import inject
from tests.faults.conftest import (
    OUTAGE_OVER,
    assert_one_outage_logged,
    expected_executions,
    outage_lines,
    tcp_client_ports,
)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Only a guard against a real hang, for waits on an observable state.
HANG = 300.0
# New work after an outage must not wait for a pooled connection to age out or for a lease to
# expire (a tester once saw runs PENDING for 30+ s). The pickup tests make both an hour long,
# far beyond HANG: if picking up depended on either, the wait would hang and fail, however fast
# or loaded the machine is. No wall-clock duration is asserted.
AN_HOUR = {"DB_CONN_MAX_AGE": "3600", "SAGAS_LEASE_TTL": "3600"}


def provider_executions() -> Counter:
    """Real executions per (provider, operation, idempotency key)."""
    return Counter(ProviderExecution.objects.values_list("provider", "operation", "idempotency_key"))


def _worker_sessions_idle(faults, *application_names: str) -> bool:
    """Each named process has a session on the database, and none of them is in a query."""
    sessions = [b for b in faults.pg.backends(faults.dbname) if b["application_name"] in application_names]
    return {b["application_name"] for b in sessions} == set(application_names) and all(
        b["state"] == "idle" for b in sessions)


def _beat_since(faults, since: float, *names: str) -> bool:
    """Each named worker process beat in the worker registry after ``since`` (epoch)."""
    rows = dict(faults.db.rows("SELECT name, extract(epoch FROM last_seen_at)::float FROM sagas_workerprocess"))
    return all(rows.get(name, 0.0) > since for name in names)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_it_completes_every_run_once_across_a_postgres_restart(faults, mode):
    """``fast``: a clean restart; ``immediate``: a crash with WAL recovery. Both drop every connection."""
    w1 = faults.worker("w1", "--concurrency", "2")
    w2 = faults.worker("w2", "--concurrency", "2")
    faults.workers_ready(w1, w2)
    driver = faults.driver()
    runs = [driver.start_ok("fault_order", {"id": f"{mode}-{i}", "pause": 0.4}) for i in range(12)]
    wait_until(lambda: faults.db.statuses(runs).get("COMPLETED", 0) >= 2, 60, interval=0.1,
               what="the first runs to complete")
    in_flight = faults.db.statuses(runs)

    faults.pg.restart(mode)
    back = time.time()
    after = faults.wait_completed(runs, 120, since=back)
    print(f"\nrestart {mode!r} with {dict(in_flight)}: the last of 12 runs completed {after:.2f}s "
          f"after the server was back")

    assert in_flight.get("COMPLETED", 0) < len(runs), "the restart hit no run in flight; nothing was tested"
    executions = provider_executions()
    assert set(executions) == expected_executions(runs)
    assert {key: n for key, n in executions.items() if n != 1} == {}, "a provider executed something twice"
    assert faults.repeated_steps() == {}, "a journaled step ran again"
    for run in runs:
        result = faults.db.run(run)["result"]
        assert set(result) == {"transaction_id", "reservation_id", "message_id"}, result
    assert w1.alive() and w2.alive()


def test_it_runs_new_work_within_seconds_of_a_restart_while_workers_were_idle(faults):
    w1 = faults.worker("w1", **AN_HOUR)
    w2 = faults.worker("w2", **AN_HOUR)
    faults.workers_ready(w1, w2)
    assert "lease 3600s" in w1.log(), w1.log()
    driver = faults.driver()
    warm = [driver.start_ok("ticks", {"steps": 2}) for _ in range(4)]
    faults.wait_completed(warm, 60)
    # every worker connection is open, then parked in its pool (idle, no query in flight)
    wait_until(lambda: _worker_sessions_idle(faults, "sagas_worker w1", "sagas_worker w2"), HANG,
               what="the workers' sessions to be idle")

    faults.pg.restart("fast")
    back = time.time()
    new = [driver.start_ok("ticks", {"steps": 3}) for _ in range(4)]
    after = faults.wait_completed(new, HANG, since=back)
    print(f"\nidle workers, restart 'fast': 4 new runs completed {after:.2f}s after the server was back")

    assert faults.repeated_steps() == {}
    assert w1.alive() and w2.alive()


def test_it_runs_new_work_within_seconds_after_a_workers_connections_are_terminated(faults):
    """``pg_terminate_backend`` of every session of one worker process (found by the
    application_name it gives them, checked against its sockets), while it runs one run and
    idles in its other thread; then new runs arrive."""
    worker = faults.worker("w1", "--concurrency", "2", **AN_HOUR)
    faults.workers_ready(worker)
    assert "lease 3600s" in worker.log(), worker.log()
    driver = faults.driver()
    warm = [driver.start_ok("ticks", {"steps": 2}) for _ in range(2)]
    faults.wait_completed(warm, 60)
    busy = driver.start_ok("ticks", {"steps": 8, "pause": 0.5})
    wait_until(lambda: sum(n for (run, _), n in faults.calls().items() if run == busy) >= 2, 30,
               what="the busy run to be under way")

    ports = tcp_client_ports(worker.pid)
    backends = faults.pg.backends(faults.dbname)
    # What an operator sees in pg_stat_activity: every session of the process carries its name.
    names = {b["application_name"] for b in backends if b["client_port"] in ports}
    assert names == {"sagas_worker w1"}, f"sessions of worker pid {worker.pid}: {backends}"
    ended = faults.pg.terminate_backends(faults.dbname, application_name="sagas_worker w1")
    ended_at = time.time()
    new = [driver.start_ok("ticks", {"steps": 3}) for _ in range(4)]
    after = faults.wait_completed([busy, *new], HANG, since=ended_at)
    print(f"\nterminated {ended} session(s) of w1: the busy run and 4 new runs completed {after:.2f}s later")

    assert ended >= 1
    assert faults.repeated_steps() == {}
    assert worker.alive()


def test_it_does_not_let_a_workflows_except_exception_swallow_a_storage_error(faults):
    """Two workflows wrap ``ctx.step`` / ``ctx.effect`` in ``try/except Exception``. The
    database goes down while the step sleeps and while the provider works, so the journal
    write of each comes during the outage. Neither workflow may see that error: both
    complete with the real value once the database is back, and nothing runs twice."""
    inject("email", "send", "latency:3")  # the provider answers 3 s after the call
    w1 = faults.worker("w1", "--concurrency", "2", DEMO_PROVIDER_TIMEOUT="15")
    w2 = faults.worker("w2", "--concurrency", "2", DEMO_PROVIDER_TIMEOUT="15")
    faults.workers_ready(w1, w2)
    driver = faults.driver()
    step_run = driver.start_ok("swallow_step", {"pause": 3.0, "linger": 8.0})
    effect_run = driver.start_ok("swallow_effect", {"id": "sw-1", "linger": 8.0})
    wait_until(
        lambda: faults.calls()[(step_run, "slow")] and "effect_intent" in faults.db.journal_kinds(effect_run), 30,
        interval=0.1, what="the step to sleep and the email to be dispatched",
    )

    step_began = faults.started_at(step_run, "slow")[0]
    down_at = time.time()
    faults.pg.stop("immediate")  # both answers arrive while it is down
    wait_until(lambda: time.time() > step_began + 3.0
               and ProviderExecution.objects.filter(provider="email", operation="send").exists(), HANG,
               interval=0.1, what="the step's pause to end and the provider to send the email")
    time.sleep(1.0)  # the outage goes on a moment after both answers (its length is not relied on)
    faults.pg.start()
    back = time.time()
    after = faults.wait_completed([step_run, effect_run], 90, since=back)
    print(f"\ncrash for 5s during a step and an effect: both completed {after:.2f}s after the server was back")

    emails = list(ProviderExecution.objects.filter(provider="email", operation="send").order_by("id"))
    assert len(emails) == 1, f"the email was sent {len(emails)} times"
    email = emails[0]
    # The outage really covered both answers (else this test tested nothing).
    assert down_at < step_began + 3.0 < back, (down_at, step_began, back)
    assert down_at < email.created_at.timestamp() < back, (down_at, email.created_at, back)

    assert faults.db.run(step_run)["result"] == {"swallowed": False, "value": "slow-done"}
    effect_result = faults.db.run(effect_run)["result"]
    assert effect_result["swallowed"] is False, effect_result
    assert effect_result["message_id"] == email.response["message_id"]
    assert faults.calls()[(step_run, "slow")] == 1, "the step ran again"


def test_it_logs_one_line_when_a_postgres_outage_starts_and_one_when_it_ends(faults):
    w1 = faults.worker("w1", "--concurrency", "2")
    w2 = faults.worker("w2", "--concurrency", "2")
    faults.workers_ready(w1, w2)
    driver = faults.driver()
    runs = [driver.start_ok("ticks", {"steps": 10, "pause": 0.3}) for _ in range(6)]
    wait_until(lambda: len(faults.calls()) >= 4, 30, what="runs to be under way")
    marks = {w.name: len(w.log()) for w in (w1, w2)}

    faults.pg.stop("fast")
    wait_until(lambda: all(outage_lines(w.log()[marks[w.name]:]) for w in (w1, w2)), HANG,
               what="both workers to meet the outage")
    # The scenario: an outage that lasts a while, so that every thread of every worker (an idle
    # sweeper's too) meets it while it lasts. Ended at once, a thread that finds its connection
    # dead only afterwards logs an outage of its own (seen: a second line 60 ms after the first
    # ended); nothing below depends on the length.
    time.sleep(4.0)
    faults.pg.start()
    back = time.time()
    after = faults.wait_completed(runs, 90, since=back)
    # the background threads notice the end too: each worker beat in the registry since, and said so
    wait_until(lambda: _beat_since(faults, back, "w1", "w2")
               and all(OUTAGE_OVER.search(w.log()[marks[w.name]:]) for w in (w1, w2)), HANG,
               what="both workers' background threads to beat after the outage")
    print(f"\n4s outage: runs completed {after:.2f}s after the server was back")

    for w in (w1, w2):
        during = w.log()[marks[w.name]:]
        assert_one_outage_logged(w.name, during)
    assert faults.repeated_steps() == {}


def test_it_starts_a_worker_while_postgres_is_down_and_it_waits_instead_of_exiting(faults):
    """A supervisor restarting workers during an outage: the worker waits for the database
    (one outage line), then takes work; it does not exit and get restarted in a loop."""
    driver = faults.driver()
    queued = [driver.start_ok("ticks", {"steps": 2}) for _ in range(3)]  # PENDING, nobody to run them
    faults.pg.stop("fast")
    worker = faults.worker("w1")
    wait_until(lambda: "storage outage: PostgreSQL unreachable" in worker.log() or not worker.alive(), 60,
               what="the worker to notice the outage")
    time.sleep(2.0)  # the outage goes on a while: the scenario, nothing depends on its length
    assert worker.alive(), worker.log()
    faults.pg.start()
    back = time.time()
    after = faults.wait_completed(queued, 60, since=back)
    print(f"\nworker started during the outage: the 3 queued runs completed {after:.2f}s after the server was back")

    log = worker.log()
    assert "storage outage over: PostgreSQL answers again" in log, log
    assert log.count("storage outage: PostgreSQL unreachable") == 1, log
    assert "Traceback" not in log, log
    assert worker.alive()


def test_a_connection_lost_while_an_effects_outcome_commits_is_retried_without_a_false_journal_gap(faults):
    """The outcome of an effect is one transaction (its journal entry and the ledger's record).
    Here the backend dies at that commit (a deferred trigger terminates it once, after the entry
    was written in the transaction): the commit fails, nothing of it is kept, and the worker
    retries it. Its retry is numbered where the failed one was: a journal that did not go back in
    time, which a soak once reported as one (``journal_gap``, the run parked, its effect UNKNOWN)."""
    with faults.pg.connect(faults.dbname) as conn:
        conn.execute("""
        CREATE SEQUENCE die_at_commit;
        CREATE FUNCTION die_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'SUCCEEDED' AND nextval('die_at_commit') = 1 THEN
                PERFORM pg_terminate_backend(pg_backend_pid());
            END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER die_once AFTER UPDATE ON ledger_effectrecord
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION die_once();
        """)
    worker = faults.worker("w1")
    faults.workers_ready(worker)
    run_id = faults.driver().start_ok("fault_order", {"id": "commit-dies", "pause": 0.05})
    faults.wait_completed([run_id], 60)

    assert faults.db.rows("SELECT last_value, is_called FROM die_at_commit")[0] >= (2, True), (
        "the backend was never terminated at an outcome's commit: nothing was tested")
    assert faults.db.run(run_id)["status"] == "COMPLETED"
    results = faults.db.rows("SELECT name, count(*) FROM sagas_journalentry WHERE run_id = %s "
                             "AND kind = 'effect_result' GROUP BY name", [run_id])
    assert dict(results) == {"capture": 1, "reserve": 1, "email": 1}, "an outcome was journaled twice or not at all"
    executions = Counter(op for (_provider, op, _key) in ProviderExecution.objects.values_list(
        "provider", "operation", "idempotency_key"))
    assert set(executions.values()) == {1}, executions
    assert "journal went back" not in worker.log(), worker.log()[-3000:]

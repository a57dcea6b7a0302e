"""Flow control per connector (``ledger.flow``) on real workers against the real simulated providers.

    .venv/bin/python bench/flow.py            # 10,000-run burst (about 4 minutes), circuit, overhead: ~8 minutes
    .venv/bin/python bench/flow.py --smoke    # tiny sizes (run by the test suite, ~40 s)
    .venv/bin/python bench/flow.py --parts 1 --unlimited   # the same burst, no limit anywhere: the floor

Its own database (``saga_bench_flow``; ``saga_bench_flow_smoke`` with ``--smoke``), which the
simulated providers share for their books, and its own Redis: every database of the shared
Redis is taken already (0 development, 1, 2 and 10-14 the other benchmarks, 3-9 and 15 the test
sessions), so this script starts a private ``redis-server`` on a free port (``bench/servers.py``)
and removes it at exit. The full size also puts its database on a private PostgreSQL server
(``--pg private``, the default; set as the shared one is: fsync and full-page writes on, 128 MB
of shared buffers): its workers, pump threads and the providers' request threads hold some 45
connections, and on the shared server (``max_connections`` 100) beside the test suites' sessions
a run once found it full ("too many clients": the providers answered 500 and 7 effects went
UNKNOWN, which opened the circuit). The smoke (2 x 4 threads) uses the shared server. ``--workers`` ``sagas_worker`` processes at ``--concurrency`` threads
(2 x 8; the smoke 2 x 4), started once, run every part; workflows and connectors are in
``bench/flow_workflows.py``. Three parts, one table:

1. Burst against a limited provider: N runs of ``flow_send`` (one ``email.send`` effect) started
   at once (in transactions of 500), the provider limited to 50 requests in any 1-second window
   (``demo.providers.limits``: over it, 429 and nothing executed) and the connector to 50/s,
   burst 1 (``connector_setting``; ``--connector-burst 2`` sets 47/s burst 2, which keeps the
   rate better but came to the provider's limit: 50 in one second and 3 calls answered 429) (``connector_limits_set``; its circuit breaker as declared: 5 failures in 60 s,
   30 s cool-down). Measured: the most provider executions in any 1-second window (from
   ``ProviderExecution.created_at``, sorted, two pointers), the same over the gate's own
   dispatch marks (``EffectRecord.dispatched_at``: the last attempt of each effect), the 429s
   (``ProviderLimit.refused``), runs not COMPLETED, and the time from the first run's creation
   to the last completion against N / 50 s (target: within 10 %).
2. The circuit's timeline: ``flow_send`` runs on ``bench.flow_mail`` (``email.send`` declaring 5
   failures, 2 s cool-down) started at a steady pace; the provider answers 503 to every request
   (``error_before_work``, nothing executed) from one moment until another, then recovers.
   Printed: every ``CircuitChange`` in seconds from the first start, the calls the provider
   got while the circuit was open (the connector logs each request it sends; target: none but
   the half-open trials), UNKNOWN effects (target 0), and the time from the recovery to the
   circuit closing (at most the cool-down, plus a trial).
3. What the machinery costs an unlimited connector: effects per second of ``flow_noop20`` runs
   (20 effects on a connector that makes no call) with flow control's rows there (the
   connector's ``ConnectorFlow`` row as ``sync_declared`` writes it: no limits, circuit breaker
   on; and its ``FlowBucket``, as after any failure) against none at all (both rows deleted
   while the workers run: ``sync_declared`` only writes them at a worker's start-up). Rounds
   alternate A/B/A/B on the same workers, tables emptied before each; medians and their ratio
   (target: under 5 % slower). Then the same in this process, one thread, ``run_effect``
   through a journal kept in memory (the ledger's own path: its record's two commits and flow
   control's statements), in batches of 50 with the variants in turn, and a third variant for
   scale: the gate's three calls on that path (the connector's key, the admission, the
   success) answered without asking the database, which is what flow control costs in all.

The exit status is 1 when the bench itself could not run (a worker died, runs never ended);
a missed target is printed, not an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.servers import PostgresServer, RedisServer

SIZES = {
    "full": dict(db="saga_bench_flow", workers=2, concurrency=8, burst_runs=10_000, rate=50, connector_burst=1,
                 circuit_runs=200, circuit_pace=20.0, outage=(2.0, 8.0),
                 overhead_runs=150, overhead_rounds=7, inprocess_batch=50, inprocess_cycles=60),
    "smoke": dict(db="saga_bench_flow_smoke", workers=2, concurrency=4, burst_runs=150, rate=50, connector_burst=1,
                  circuit_runs=40, circuit_pace=20.0, outage=(0.5, 2.5),
                  overhead_runs=15, overhead_rounds=2, inprocess_batch=20, inprocess_cycles=3),
}
START_BATCH = 500  # runs started per transaction in the burst
STALL_SECONDS = 90.0  # no run ended for this long: the part gives up and reports what it has
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "COMPENSATED")
MAIL, NOOP = "bench.flow_mail", "bench.flow_noop"


# --- set-up -------------------------------------------------------------------------------


def start_private_postgres(pg: PostgresServer, db: str) -> None:
    """A private server set as the shared one is (fsync, full-page writes, 128 MB of shared
    buffers: bench/servers.py turns the first two off for tests), holding ``db``."""
    pg.start()
    with pg.connect() as conn:
        for setting in ("fsync = on", "full_page_writes = on", "shared_buffers = '128MB'"):
            conn.execute(f"ALTER SYSTEM SET {setting}")
    pg.restart("fast")
    pg.create_database(db)


def truncate() -> None:
    """Empty the engine's, the ledger's and the providers' tables (connectors' rows stay)."""
    from django.db import connection

    from core.append_only import TRUNCATE_ESCAPE_GUC

    with connection.cursor() as cur:
        cur.execute(f"SET {TRUNCATE_ESCAPE_GUC} = on")
        cur.execute("TRUNCATE sagas_journalentry, sagas_workflowrun, ledger_effectrecord, ledger_flowticket, "
                    "ledger_flowbucket, ledger_circuitchange, demo_providerexecution, demo_providerreplay, "
                    "demo_providerfault, demo_providerlimit CASCADE")
        cur.execute(f"RESET {TRUNCATE_ESCAPE_GUC}")


class Workers:
    """``sagas_worker`` processes, each in its own process group, logging to a file."""

    def __init__(self, count: int, concurrency: int, env: dict[str, str], log_dir: Path) -> None:
        self.procs: list[subprocess.Popen] = []
        self.ready = [log_dir / f"flow-w{i}.ready" for i in range(1, count + 1)]
        for i, ready in enumerate(self.ready, start=1):
            with open(log_dir / f"flow-w{i}.log", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "manage.py", "sagas_worker", "--name", f"flow-w{i}", "--concurrency",
                     str(concurrency), "--ready-file", str(ready)],
                    cwd=common.ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))

    def wait_ready(self, timeout: float = 90) -> None:
        if not common.wait_for(lambda: all(r.exists() for r in self.ready) or self.dead(), timeout) or self.dead():
            raise SystemExit(f"the workers did not start: {self.dead() or 'not ready'}")

    def dead(self) -> list[str]:
        return [f"flow-w{i} exited {p.returncode}" for i, p in enumerate(self.procs, 1) if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


# --- measuring ------------------------------------------------------------------------------


def max_in_window(times: list[float], width: float = 1.0) -> int:
    """The most events in any half-open window ``[t, t + width)``: sorted, two pointers."""
    times = sorted(times)
    best, i = 0, 0
    for j, t in enumerate(times):
        while t - times[i] >= width:
            i += 1
        best = max(best, j - i + 1)
    return best


def epochs(sql: str, params: list) -> list[float]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [float(t) for (t,) in cur.fetchall()]


def one(sql: str, params: list):  # type: ignore[no-untyped-def]
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def statuses(workflow: str) -> Counter[str]:
    from django.db.models import Count

    from sagas.models import WorkflowRun

    rows = WorkflowRun.objects.filter(workflow_name=workflow).values("status").annotate(n=Count("id"))
    return Counter({row["status"]: row["n"] for row in rows})


def wait_ended(workflow: str, runs: int, workers: Workers, *, label: str, deadline: float,
               report_every: float = 0.0) -> Counter[str]:
    """Wait until every run of ``workflow`` is finished (or NEEDS_ATTENTION), no run ended for
    ``STALL_SECONDS`` or ``deadline`` (``time.monotonic()``) passed; the statuses then."""
    last_ended, last_change, last_report = -1, time.monotonic(), time.monotonic()
    while True:
        counts = statuses(workflow)
        ended = sum(counts[s] for s in (*TERMINAL, "NEEDS_ATTENTION"))
        now = time.monotonic()
        if ended != last_ended:
            last_ended, last_change = ended, now
        if ended >= runs:
            return counts
        if workers.dead():
            raise SystemExit(f"{label}: a worker died: {workers.dead()}")
        if now - last_change > STALL_SECONDS or now > deadline:
            print(f"{label}: giving up with {ended} of {runs} runs ended: {dict(counts)}", file=sys.stderr)
            return counts
        if report_every and now - last_report >= report_every:
            last_report = now
            print(f"{time.strftime('%H:%M:%S')} {label}: {dict(counts)}", file=sys.stderr, flush=True)
        time.sleep(0.5)


# --- 1. burst against a limited provider ------------------------------------------------------


class GrantedSampler:
    """Samples, every 0.1 s while tickets wait, how many tickets the pump has let go whose runs
    have not yet taken their token (``FlowTicket`` GRANTED): the pump lets no more go than the
    tokens of its look-ahead, less these."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.series: list[tuple[float, int, int]] = []  # (time.time(), waiting, granted)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="granted-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self.halt.wait(0.1):
                with connection.cursor() as cur:
                    cur.execute("SELECT count(*) FILTER (WHERE state = 'waiting'), "
                                "count(*) FILTER (WHERE state = 'granted') FROM ledger_flowticket")
                    waiting, granted = cur.fetchone()
                self.series.append((time.time(), int(waiting), int(granted)))
                if waiting:
                    self.samples.append(int(granted))
        finally:
            connection.close()

    def stop(self) -> list[int]:
        self.halt.set()
        self.thread.join(10)
        return self.samples


def write_trace(path: str, series: list[tuple[float, int, int]], first_start: float) -> None:
    """Per second of the burst: tickets waiting and granted (the last sample of the second), runs
    released by the pump, claims, dispatch marks and provider executions."""
    from django.db import connection

    def per_second(sql: str) -> Counter[int]:
        with connection.cursor() as cur:
            cur.execute(sql)
            return Counter({int(s): int(n) for s, n in cur.fetchall()})

    second = f"floor(extract(epoch FROM {{}}) - {first_start})"
    released = per_second(f"SELECT {second.format('created_at')}, count(*) FROM sagas_journalentry "
                          "WHERE kind = 'flow_released' GROUP BY 1")
    claims = per_second(f"SELECT {second.format('created_at')}, count(*) FROM sagas_journalentry "
                        "WHERE kind = 'claimed' GROUP BY 1")
    marks = per_second(f"SELECT {second.format('dispatched_at')}, count(*) FROM ledger_effectrecord "
                       "WHERE dispatched_at IS NOT NULL GROUP BY 1")
    executed = per_second(f"SELECT {second.format('created_at')}, count(*) FROM demo_providerexecution GROUP BY 1")
    tickets = {int(t - first_start): (w, g) for t, w, g in series}
    last = max([*released, *claims, *marks, *executed, *tickets, 0])
    with open(path, "w") as out:
        out.write("second,waiting,granted,released,claims,dispatch_marks,executions\n")
        for sec in range(last + 1):
            w, g = tickets.get(sec, ("", ""))
            out.write(f"{sec},{w},{g},{released[sec]},{claims[sec]},{marks[sec]},{executed[sec]}\n")


JITTER_HEADROOM = 1  # calls per second kept below the provider's limit with burst > 1


def connector_setting(provider_rate: int, burst: int) -> tuple[float, int]:
    """The connector's (rate, burst) for a provider limited to ``provider_rate`` calls in any
    1-second window. The rate limiter lets at most ``rate x 1 s + burst`` leave in any second
    (counted at the dispatch marks: 48/s burst 2 let 50 go); the provider counts them as they
    arrive, a few ms later and not all equally late, so with burst 2 the rate is
    ``provider_rate - burst - JITTER_HEADROOM`` (47 at 50: 48/s burst 2 once let 51 arrive in
    one second, and 27 calls got a 429). Burst 1 (50/s at 50) spaces calls a full interval
    apart and never came near the limit (44 and 45), but each call that leaves late loses its
    lateness for good: 35 to 41 calls a second."""
    if burst == 1:
        return float(provider_rate), 1
    return float(provider_rate - burst - JITTER_HEADROOM), burst


def burst_setting(size: dict) -> tuple[float, int]:
    """The connector's (rate, burst) in the burst part: ``--connector-rate`` if given, else
    ``connector_setting``'s."""
    rate, burst = connector_setting(size["rate"], size["connector_burst"])
    return float(size.get("connector_rate") or rate), burst


def burst(size: dict, workers: Workers, trace: str | None = None) -> list[tuple[str, str, str]]:
    from django.db import transaction

    from demo.providers import limits
    from ledger.flow.pump import LOOKAHEAD_SECONDS as LOOKAHEAD
    from ledger.flow.pump import MAX_AHEAD_SECONDS as MAX_AHEAD
    from ledger.flow.services import Limits, connector_limits_set
    from ledger.models import CircuitChange, ConnectorFlow
    from sagas import start

    n, rate = size["burst_runs"], size["rate"]
    connector_rate, connector_burst = burst_setting(size)
    unlimited = size.get("unlimited", False)
    truncate()
    limits.limit("email", "send", None if unlimited else rate)
    declared = Limits.of(ConnectorFlow.objects.get(connector="email.send"))
    connector_limits_set(connector="email.send", by="bench/flow.py",
                         limits=dataclasses.replace(declared, rate=None if unlimited else connector_rate,
                                                    burst=connector_burst, max_in_flight=None))
    sampler = GrantedSampler()
    began = time.perf_counter()
    for first in range(0, n, START_BATCH):
        with transaction.atomic():
            for i in range(first, min(n, first + START_BATCH)):
                start("flow_send", {"connector": "email.send", "n": i}, business_key=f"burst-{i}")
    started_in = time.perf_counter() - began
    counts = wait_ended("flow_send", n, workers, label="burst", deadline=time.monotonic() + 3 * n / rate + 300,
                        report_every=15.0)
    granted = sampler.stop()

    executions = epochs("""SELECT extract(epoch FROM created_at) FROM demo_providerexecution
                            WHERE provider = 'email' AND operation = 'send' ORDER BY created_at""", [])
    marks = epochs("""SELECT extract(epoch FROM dispatched_at) FROM ledger_effectrecord
                       WHERE connector = 'email.send' AND dispatched_at IS NOT NULL""", [])
    first_start, last_done = one("""SELECT extract(epoch FROM min(created_at)), extract(epoch FROM max(finished_at))
                                      FROM sagas_workflowrun WHERE workflow_name = 'flow_send'""", [])
    attempts, unknown = one("""SELECT coalesce(sum(attempts), 0), count(*) FILTER (WHERE status = 'UNKNOWN')
                                 FROM ledger_effectrecord WHERE connector = 'email.send'""", [])
    # Where a held run's time goes once the pump lets its ticket go: its flow_released entry to
    # the next claim (the wake-up through the queue), and that claim to its dispatch mark (replay,
    # then the wait for its token in the thread).
    wake = one("""
        WITH rel AS (SELECT run_id, min(created_at) AS rel FROM sagas_journalentry
                      WHERE kind = 'flow_released' GROUP BY run_id),
             cl AS (SELECT j.run_id, min(j.created_at) AS cl FROM sagas_journalentry j JOIN rel USING (run_id)
                     WHERE j.kind = 'claimed' AND j.created_at > rel.rel GROUP BY j.run_id),
             x AS (SELECT extract(epoch FROM cl - rel) AS woke, extract(epoch FROM e.dispatched_at - cl) AS went
                     FROM rel JOIN cl USING (run_id) JOIN ledger_effectrecord e USING (run_id))
        SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY woke),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY woke),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY went), percentile_cont(0.95) WITHIN GROUP (ORDER BY went)
          FROM x""", [])
    all_claimed = one("""SELECT extract(epoch FROM max(first)) FROM (
                           SELECT min(created_at) AS first FROM sagas_journalentry WHERE kind = 'claimed'
                            GROUP BY run_id) f""", [])[0]
    refused = limits.refused("email", "send")
    if trace:
        write_trace(trace, sampler.series, float(first_start))
    changes = list(CircuitChange.objects.filter(connector="email.send").order_by("at", "id")
                   .values_list("state", flat=True))
    limits.limit("email", "send", None)
    connector_limits_set(connector="email.send", by="bench/flow.py", limits=None)  # back to the declared ones

    completed = counts["COMPLETED"]
    total = float(last_done) - float(first_start) if last_done is not None else float("nan")
    ideal = n / rate
    steady = ""
    if len(executions) >= 10:
        lo, hi = executions[len(executions) // 10], executions[len(executions) * 9 // 10]
        steady = f"{(len(executions) * 9 // 10 - len(executions) // 10) / (hi - lo):.1f}/s" if hi > lo else ""
    over = total / ideal - 1
    return [
        ("runs started at once (one email.send effect each)", f"{n:,}", f"started in {started_in:.1f} s"),
        ("provider executions, most in any 1-second window", str(max_in_window(executions)), f"<= {rate}"),
        ("gate's dispatch marks, most in any 1-second window", str(max_in_window(marks)),
         f"<= {rate} (last attempt of each effect)"),
        ("provider 429s (ProviderLimit.refused)", str(refused), "0 (a 429 uses a token and a second)"),
        ("dispatches per effect (attempts / effects)", f"{attempts / max(1, len(marks)):.3f}", "1"),
        ("runs not COMPLETED", str(n - completed),
         "0" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()) if k != 'COMPLETED')})"
                if n - completed else "")),
        ("UNKNOWN effects", str(unknown), "0"),
        ("circuit changes of email.send during the burst", str(len(changes)),
         " -> ".join(changes) if changes else "none expected"),
        ("first execution, from the first start", f"{executions[0] - float(first_start):.2f} s" if executions else "-",
         ""),
        ("provider executions per second, 10th to 90th percentile", steady, f"{rate}/s"),
        ("every run claimed once (held or sent), from the first start",
         f"{float(all_claimed) - float(first_start):.1f} s" if all_claimed is not None else "-",
         f"{sum(1 for t in executions if all_claimed is not None and t <= float(all_claimed)):,} executions by then"),
        (f"held runs let go by the pump ({wake[0]:,}): released to claimed, p50 / p95",
         f"{wake[1] * 1000:.0f} / {wake[2] * 1000:.0f} ms" if wake[0] else "-", "the wake-up through the queue"),
        ("... then claimed to dispatched, p50 / p95", f"{wake[3] * 1000:.0f} / {wake[4] * 1000:.0f} ms" if wake[0] else "-",
         "replay, then the token's wait in the thread"),
        ("tickets let go and not yet taken, sampled every 0.1 s while runs waited: p50 / max",
         f"{common.median(granted):.0f} / {max(granted)}" if granted else "-",
         f"let go on the pump's clock ({LOOKAHEAD:g} s ahead), at most {rate} x {MAX_AHEAD:g} s + 1 = "
         f"{int(rate * MAX_AHEAD + 1)} on their way"),
        ("first start to last completion", f"{total:.1f} s", f"N/{rate} = {ideal:.0f} s"),
        ("... against N / rate", f"{100 * over:+.1f} %", "within 10 %" + ("" if over <= 0.10 else ": NOT met")),
    ]


# --- 2. the circuit's timeline -----------------------------------------------------------------


def read_calls(folder: Path) -> list[tuple[float, float, str, str]]:
    """(sent, dispatch marked, outcome, key) of every call bench.flow_mail sent, in order."""
    calls = []
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            sent, marked, outcome, key = line.split(" ", 3)
            calls.append((float(sent), float(marked), outcome, key))
    return sorted(calls)


class CircuitWatcher:
    """Reads the circuit's state from its bucket every 2 ms, for when each change became
    visible (committed): ``CircuitChange.at`` is the time its transaction began deciding it."""

    def __init__(self, connector: str) -> None:
        self.connector = connector
        self.seen: list[tuple[float, str]] = []  # (time.time() after the read, state), at each change
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="circuit-watcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from django.db import connection

        last = None
        try:
            with connection.cursor() as cur:
                while not self.halt.wait(0.002):
                    cur.execute("SELECT circuit FROM ledger_flowbucket WHERE connector = %s AND key = ''",
                                [self.connector])
                    row = cur.fetchone()
                    state = row[0] if row else "closed"
                    if state != last:
                        self.seen.append((time.time(), state))
                        last = state
        finally:
            connection.close()

    def stop(self) -> list[tuple[float, str]]:
        self.halt.set()
        self.thread.join(10)
        return self.seen


def circuit(size: dict, workers: Workers, calls_dir: Path) -> tuple[list[tuple[str, str, str]], list[tuple[str, ...]]]:
    from demo.providers import faults
    from ledger.models import CircuitChange, ConnectorFlow, EffectRecord
    from sagas import start

    n, pace = size["circuit_runs"], size["circuit_pace"]
    fail_at, recover_at = size["outage"]
    truncate()
    for path in calls_dir.glob("*.log"):
        path.unlink()
    flow = ConnectorFlow.objects.get(connector=MAIL)
    assert (flow.circuit_failures, flow.circuit_cooldown_seconds) == (5, 2.0), "bench.flow_mail's declared breaker"
    marks: dict[str, float] = {}
    watcher = CircuitWatcher(MAIL)
    t0 = time.time()

    def starter() -> None:
        from django.db import connection

        try:
            for i in range(n):
                delay = t0 + i / pace - time.time()
                if delay > 0:
                    time.sleep(delay)
                start("flow_send", {"connector": MAIL, "n": i}, business_key=f"circuit-{i}")
        finally:
            connection.close()

    thread = threading.Thread(target=starter, name="starter")
    thread.start()
    time.sleep(max(0.0, t0 + fail_at - time.time()))
    faults.inject("email", "send", "error_before_work", times=1_000_000)
    marks["fail"] = time.time()
    time.sleep(max(0.0, t0 + recover_at - time.time()))
    faults.clear()
    marks["recover"] = time.time()
    thread.join()
    counts = wait_ended("flow_send", n, workers, label="circuit", deadline=time.monotonic() + 120 + n / pace)
    seen = watcher.stop()
    last_done = one("SELECT extract(epoch FROM max(finished_at)) FROM sagas_workflowrun WHERE workflow_name = 'flow_send'",
                    [])[0]
    changes = [(row.at.timestamp(), row.state, row.failures)
               for row in CircuitChange.objects.filter(connector=MAIL).order_by("at", "id")]
    calls = read_calls(calls_dir)
    unknown = EffectRecord.objects.filter(connector=MAIL, status="UNKNOWN").count()

    def change_at(t: float) -> tuple[float, str]:
        """(when, state) of the circuit's last change at or before ``t``."""
        last = (float("-inf"), "closed")
        for at, new, _ in changes:
            if at <= t:
                last = (at, new)
        return last

    def state_at(t: float) -> str:
        return change_at(t)[1]

    def seen_open(opened: float) -> float:
        """When the opening recorded at ``opened`` was first read back committed."""
        return next((t for t, state in seen if state == "open" and t >= opened), float("inf"))

    while_open = [c for c in calls if state_at(c[0]) == "open"]
    # A call sent while open was let go either before the opening committed (in flight as the
    # circuit opened: a breaker cannot recall it) or after: the gate let it go while open.
    let_go_open = [c for c in while_open if c[1] > seen_open(change_at(c[0])[0])]
    for sent, marked, outcome, key in while_open:
        opened = change_at(sent)[0]
        print(f"circuit: a call sent {1000 * (sent - opened):.1f} ms after the circuit opened (recorded; read back "
              f"committed {1000 * (seen_open(opened) - opened):.1f} ms after), its dispatch marked "
              f"{1000 * (marked - opened):+.1f} ms from the opening: {outcome} {key}", file=sys.stderr)
    while_half = [c for c in calls if state_at(c[0]) == "half_open"]
    half_periods = sum(1 for _, s, _ in changes if s == "half_open")
    failed_calls = sum(1 for c in calls if c[2] != "ok")
    closed_after = [at for at, s, _ in changes if s == "closed" and at >= marks["recover"]]
    to_closed = closed_after[0] - marks["recover"] if closed_after else float("nan")

    timeline: list[tuple[str, ...]] = [("at (s from the first start)", "event", "detail")]
    events = [(marks["fail"], "provider starts failing", "every /email/send answered 503, nothing executed"),
              (marks["recover"], "provider recovered", "faults cleared")]
    for at, state, failures in changes:
        detail = f"after {failures} failures" if state == "open" and failures else ""
        if state == "half_open":
            trial = next((c[2] for c in calls if c[0] >= at and state_at(c[0]) == "half_open"), None)
            detail = f"trial call: {trial or 'none sent'}"
        events.append((at, f"circuit {state}", detail))
    if last_done is not None:
        events.append((float(last_done), "last run finished", f"{counts['COMPLETED']} of {n} COMPLETED"))
    for at, what, detail in sorted(events):
        timeline.append((f"{at - t0:7.3f}", what, detail))

    cooldown = flow.circuit_cooldown_seconds
    rows = [
        ("runs (one bench.flow_mail effect each), started at", f"{n} at {pace:g}/s",
         f"provider down from {fail_at:g} s to {recover_at:g} s"),
        ("circuit changes (open / half_open / closed)",
         " / ".join(str(sum(1 for _, s, _ in changes if s == k)) for k in ("open", "half_open", "closed")), ""),
        ("calls the provider got while the circuit was open", str(len(while_open)),
         "only calls let go before the opening committed"),
        ("... of them let go after the opening had committed", str(len(let_go_open)),
         "0 (dispatch mark later than the open state was first read back)"),
        ("calls while half-open / half-open periods", f"{len(while_half)} / {half_periods}", "1 trial each"),
        ("calls that failed (503) in all", str(failed_calls), ""),
        ("UNKNOWN effects", str(unknown), "0"),
        ("runs not COMPLETED", str(n - counts["COMPLETED"]),
         "0" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()) if k != 'COMPLETED')})"
                if n - counts["COMPLETED"] else "")),
        ("provider recovered to circuit closed", f"{to_closed:.2f} s", f"<= cool-down {cooldown:g} s + a trial"),
    ]
    return rows, timeline


# --- 3. the machinery's cost on an unlimited connector ------------------------------------------


def set_rows(present: bool) -> None:
    """A: the connector's flow row (as a worker writes it at start-up) and its bucket; B: neither."""
    from ledger.flow.services import sync_declared
    from ledger.models import ConnectorFlow, FlowBucket

    if present:
        sync_declared()
        FlowBucket.objects.get_or_create(connector=NOOP, key="", defaults={"circuit": "closed", "failures": 0})
    else:
        ConnectorFlow.objects.filter(connector=NOOP).delete()
        FlowBucket.objects.filter(connector=NOOP).delete()


def overhead_round(runs: int, workers: Workers, present: bool) -> float:
    """Effects per second of ``runs`` flow_noop20 runs started together, with the flow rows
    there or not: their effects over the time from the first claim to the last completion
    (from the journal)."""
    from django.db import transaction

    from ledger.models import ConnectorFlow, FlowBucket
    from sagas import start

    truncate()
    set_rows(present)
    assert ConnectorFlow.objects.filter(connector=NOOP).exists() == present
    with transaction.atomic():
        for i in range(runs):
            start("flow_noop20", {"i": i})
    counts = wait_ended("flow_noop20", runs, workers, label="overhead", deadline=time.monotonic() + 300)
    if counts["COMPLETED"] != runs:
        raise SystemExit(f"overhead: {counts['COMPLETED']} of {runs} runs completed: {dict(counts)}")
    # Nothing re-created the rows behind the bench's back (nor removed them).
    assert ConnectorFlow.objects.filter(connector=NOOP).exists() == present
    assert FlowBucket.objects.filter(connector=NOOP).exists() == present
    seconds = one("""SELECT extract(epoch FROM max(created_at) FILTER (WHERE kind = 'completed')
                                          - min(created_at) FILTER (WHERE kind = 'claimed'))
                       FROM sagas_journalentry""", [])[0]
    return runs * 20 / float(seconds)


class BenchJournal:
    """The least ``ledger.journal.Journal`` the protocol runs on: entries kept in memory (no
    journal write), one owner, nothing recorded before. ``run_effect`` on it costs what the
    ledger costs an effect: its record's two commits, the connector's call, flow control's
    statements."""

    def __init__(self) -> None:
        import uuid

        self.run_id, self.tenant, self.seq = str(uuid.uuid4()), "bench-flow", 0
        self._names: dict[tuple[str, str], int] = {}

    def unique_name(self, name: str, space: str = "call") -> str:
        count = self._names[(space, name)] = self._names.get((space, name), 0) + 1
        return name if count == 1 else f"{name}#{count}"

    def effect_key(self, name: str) -> str:
        return f"{self.run_id}:{name}"

    def replay_next(self, kind: str, name: str, also: frozenset[str] = frozenset()) -> None:
        return None

    def recorded_event(self, kind: str, name: str) -> None:
        return None

    def before_live(self) -> None:
        pass

    def before_retry(self) -> None:
        pass

    def append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0) -> int:
        self.seq += 1
        return self.seq

    def check_fence(self) -> None:
        pass

    def durably(self, write, *, kind, name, recorded):  # type: ignore[no-untyped-def]
        return write()

    def intent_recorded(self, effect):  # type: ignore[no-untyped-def]
        pass

    def crash_point(self, point: str, name: str) -> None:
        pass

    def hold(self, hold):  # type: ignore[no-untyped-def]
        raise AssertionError(f"an unlimited connector was held: {hold}")


class GateSkipped:
    """For scale only, in this process: the protocol's calls into the gate on an effect's
    path (its key, the admission, the success) replaced by what they answer an unlimited
    connector without a flow row, without asking the database."""

    def __enter__(self) -> None:
        from ledger.flow import gate

        self.saved = gate.key_field_of, gate.admit, gate.record_success
        gate.key_field_of = lambda connector: ""  # type: ignore[assignment]
        gate.admit = lambda effect, **kwargs: gate.GO  # type: ignore[assignment]
        gate.record_success = lambda effect: None  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        from ledger.flow import gate

        gate.key_field_of, gate.admit, gate.record_success = self.saved


def in_process_batch(journal: BenchJournal, effects: int, variant: str) -> float:
    """Microseconds per ``run_effect`` on ``bench.flow_noop`` in this process, one thread, over
    ``effects`` effects: ``rows`` (flow rows there), ``none`` (no flow rows), ``skipped`` (no rows,
    and the gate not asked)."""
    import contextlib

    from ledger.protocol import run_effect

    set_rows(variant == "rows")
    with GateSkipped() if variant == "skipped" else contextlib.nullcontext():
        began = time.perf_counter()
        for i in range(effects):
            run_effect(journal, name="e", connector_name=NOOP, payload={"i": i})
        took = time.perf_counter() - began
    return took / effects * 1e6


def paired(a: list[float], b: list[float]) -> float:
    """The median of the ratios b/a, pair by pair (each pair ran one right after the other)."""
    return common.median([y / x for x, y in zip(a, b, strict=True)])


def overhead(size: dict, workers: Workers) -> list[tuple[str, str, str]]:
    runs, rounds = size["overhead_runs"], size["overhead_rounds"]
    overhead_round(runs, workers, True)  # warm-up, not counted
    with_rows, without = [], []
    for _ in range(rounds):
        for present, samples in ((True, with_rows), (False, without)):
            samples.append(overhead_round(runs, workers, present))
    a, b = common.median(with_rows), common.median(without)
    slower = b / a - 1

    # The same question in this process, one thread, no queue, no other run: the ledger's own
    # path per effect, where flow control's statements are a larger share. Small batches, the
    # variants in turn (their order rotated each cycle), so a busy minute weighs on each alike.
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE ledger_effectrecord CASCADE")
    journal, batch, cycles = BenchJournal(), size["inprocess_batch"], size["inprocess_cycles"]
    variants = ["rows", "none", "skipped"]
    in_process_batch(journal, batch, "rows")  # warm-up
    per: dict[str, list[float]] = {v: [] for v in variants}
    for cycle in range(cycles):
        for variant in variants[cycle % 3:] + variants[:cycle % 3]:
            per[variant].append(in_process_batch(journal, batch, variant))
    set_rows(True)
    ra, rb, rc = (common.median(per[v]) for v in variants)
    in_slower = ra / rb - 1
    in_paired = paired(per["none"], per["rows"]) - 1
    return [
        (f"workers: effects/s, flow rows there (unlimited, breaker on), median of {rounds}", f"{a:,.0f}",
         "rounds: " + ", ".join(f"{x:.0f}" for x in with_rows)),
        (f"workers: effects/s, no flow rows, median of {rounds}", f"{b:,.0f}",
         "rounds: " + ", ".join(f"{x:.0f}" for x in without)),
        ("workers: with rows against without, slower by (medians)", f"{100 * slower:+.1f} %",
         "under 5 %" + ("" if slower < 0.05 else ": NOT met")),
        ("workers: ... the median of the A/B pairs' ratios", f"{100 * (paired(with_rows, without) - 1):+.1f} %",
         "each pair one round after the other"),
        (f"in-process: us per effect, flow rows there, median of {cycles} batches of {batch}", f"{ra:.0f}",
         f"p10-p90 {common.percentile(per['rows'], 10):.0f}-{common.percentile(per['rows'], 90):.0f}"),
        ("in-process: us per effect, no flow rows", f"{rb:.0f}",
         f"p10-p90 {common.percentile(per['none'], 10):.0f}-{common.percentile(per['none'], 90):.0f}"),
        ("in-process: with rows against without, slower by (medians)", f"{100 * in_slower:+.1f} %",
         "under 5 %" + ("" if in_slower < 0.05 else ": NOT met")),
        ("in-process: ... the median of the cycles' ratios", f"{100 * in_paired:+.1f} %",
         "each cycle runs the three variants back to back"),
        ("in-process, for scale: us per effect, the gate not asked at all", f"{rc:.0f}",
         f"flow control's statements cost {ra - rc:+.0f} us ({100 * (ra / rc - 1):+.1f} %) with rows, "
         f"{rb - rc:+.0f} us without"),
    ]


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite runs this)")
    parser.add_argument("--parts", default="123", help="which parts to run (default 123)")
    parser.add_argument("--runs", type=int, default=None, help="runs in the burst")
    parser.add_argument("--connector-burst", type=int, default=None,
                        help="the connector's burst in the burst part (default 1, at 50/s; with 2 or more the rate is 50 - burst - 1)")
    parser.add_argument("--connector-rate", type=float, default=None,
                        help="the connector's rate in the burst part (default: the provider's 50, less headroom with burst > 1)")
    parser.add_argument("--unlimited", action="store_true",
                        help="the burst part with no limit anywhere (provider and connector): what the machine does "
                             "with the same runs, the floor of the limited burst's time")
    parser.add_argument("--pg", choices=("private", "shared"), default=None,
                        help="PostgreSQL: a private server (default for the full size) or the shared one (the smoke's)")
    parser.add_argument("--trace", default=None, help="write the burst's per-second figures to this CSV file")
    args = parser.parse_args()
    size = dict(SIZES["smoke" if args.smoke else "full"])
    args.pg = args.pg or ("shared" if args.smoke else "private")
    if args.runs:
        size["burst_runs"] = args.runs
    if args.connector_burst:
        size["connector_burst"] = args.connector_burst
    if args.connector_rate:
        size["connector_rate"] = args.connector_rate
    if args.unlimited:
        size["unlimited"] = True
    log_dir = Path(tempfile.mkdtemp(prefix="bench-flow-"))
    calls_dir = log_dir / "calls"
    calls_dir.mkdir()
    redis = RedisServer()
    pg = PostgresServer(max_connections=200) if args.pg == "private" else None
    providers = workers = None
    ok = False
    try:
        redis.start()
        if pg is not None:
            start_private_postgres(pg, size["db"])
            common.BENCH_DB = pg.url(size["db"])
        else:
            common.BENCH_DB = common.BENCH_DB.rsplit("/", 1)[0] + "/" + size["db"]
        common.BENCH_REDIS = redis.url(0)
        extra = dict(SAGAS_MODULES="bench.flow_workflows", BENCH_FLOW_CALLS=str(calls_dir))
        common.setup_django(**extra)
        truncate()
        providers, url = common.start_providers(common.bench_env(**extra))
        env = common.bench_env(DEMO_PROVIDERS_URL=url, **extra)
        where = f"private PostgreSQL :{pg.port}" if pg is not None else "the shared PostgreSQL"
        print(f"{time.strftime('%H:%M:%S')} bench/flow.py: database {size['db']} on {where}, private Redis :{redis.port}, "
              f"providers {url}, {size['workers']} workers x {size['concurrency']} threads, logs {log_dir}",
              file=sys.stderr, flush=True)
        workers = Workers(size["workers"], size["concurrency"], env, log_dir)
        workers.wait_ready()
        rows: list[tuple[str, ...]] = [("figure", "value", "target / note")]
        timeline = None
        if "1" in args.parts:
            c_rate, c_burst = burst_setting(size)
            rows.append((f"**1. burst: {size['burst_runs']:,} runs, no limit anywhere (the machine's floor)**", "", "")
                        if size.get("unlimited") else
                        (f"**1. burst: {size['burst_runs']:,} runs, provider at {size['rate']} in any second, "
                         f"connector at {c_rate:g}/s burst {c_burst}**",
                         "", ""))
            rows += burst(size, workers, args.trace)
        if "2" in args.parts:
            rows.append(("**2. circuit: 5 failures open it, 2 s cool-down**", "", ""))
            circuit_rows, timeline = circuit(size, workers, calls_dir)
            rows += circuit_rows
        if "3" in args.parts:
            rows.append((f"**3. overhead: {size['overhead_runs']} runs x 20 effects on an unlimited connector "
                         f"per round, A/B alternating**", "", ""))
            rows += overhead(size, workers)
        load = os.getloadavg()
        common.print_table(f"Flow control ({size['workers']} worker processes x {size['concurrency']} threads; "
                           f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", rows)
        if timeline is not None:
            common.print_table("Circuit of bench.flow_mail, timeline", timeline)
        ok = True
    except BaseException:
        traceback.print_exc()
    finally:
        for step in (workers.stop if workers is not None else None,
                     providers.kill if providers is not None else None, redis.cleanup,
                     pg.cleanup if pg is not None else None):
            if step is not None:
                try:
                    step()
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
    if ok:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        print(f"worker logs kept: {log_dir}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

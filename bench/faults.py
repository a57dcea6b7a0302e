"""Fault soak: order runs under worker SIGKILLs, PostgreSQL and Redis outages and provider timeouts.

    .venv/bin/python bench/faults.py               # both rounds below, one after the other (6 to 7 minutes)
    .venv/bin/python bench/faults.py --no-failover # 1,000 runs, 4 workers, every fault kind but failover (about 4 minutes)
    .venv/bin/python bench/faults.py --failover    # 500 runs, 4 workers, 3 failovers of a pg_auto_failover formation (about 2.5 minutes)
    .venv/bin/python bench/faults.py --smoke       # 40 runs, 2 workers, one fault of most kinds (the test suite)

What runs: ``faults_order`` (``bench/faults_workflows.py``): a pure step, then
``payments.capture``, ``inventory.reserve`` and ``shipping.create`` through the
ledger against the real simulated providers. 10 % of the runs wait for an approval
before shipping, which this script gives (as a user other than the starter) about a
second after it is requested; 5 % have no address, so the shipping provider refuses
them (422) and the saga refunds and releases: COMPENSATED by design. The rest must
end COMPLETED.

Where: the engine runs on its OWN PostgreSQL and Redis servers (``bench/servers.py``:
temp directories, free ports), which this script restarts, crashes and flushes. The
providers keep their books on the shared server (database
``saga_bench_faults_providers``; ``..._2`` and so on while another soak holds that
one), which nothing here restarts, so every real execution is counted whatever
happens to the engine's servers.

How: ``--workers`` ``sagas_worker`` processes (``faults-w1`` ...), each in its own
process group, each respawned under its name one second after it dies on its own (a
supervisor's restart). A starter keeps a small backlog of runs so that every worker
always has work, retrying a start that fails (same business key, so at most one run
per order). Faults, one at a time, each after the previous one has been recovered
from (or 60 s have passed) and a gap of 1 to 3 s:

* worker SIGKILL: the process group of a random worker, respawned at once (full size:
  filling every gap, so one every few seconds);
* PostgreSQL restart (``pg_ctl restart -m fast``, and one ``-m immediate``: a crash);
* a round of ``pg_terminate_backend`` on a random half of the workers' sessions;
* Redis restart (an outage that also loses every queued wake-up), Redis FLUSHALL;
* provider timeout: the provider does the work, commits it, and answers too late
  (``timeout_after_work``), so the effect goes UNKNOWN and has to be reconciled by
  a status lookup.

The failover round (``--failover``; the default run does it after the round above, in a
process of its own): the same load, workers and providers, but the engine's database is a
pg_auto_failover formation (``bench/autofailover.py``: a monitor, a primary and a synchronous
secondary) and every process has its multi-host URL (``target_session_attrs=read-write``) and
nothing else. The only fault is the primary's host going down (``kill_primary``: its keeper
SIGKILLed, its PostgreSQL stopped ``-m immediate``), ``--failovers`` times (default 3); the
killed node rejoins as the secondary before the next kill. Measured per failover, from the kill
(its PostgreSQL stopped): until the new primary accepts writes, until the first step journaled
on it, until every worker progressing again, until a run finished again. ``--smoke`` leaves the
round out: the formation alone costs about 25 s to start and clean up here, and
``tests/faults/test_failover.py`` proves failover in the suite; ``--failover --smoke`` is 40
runs and one failover.

Measured, sampled every 0.2 s from the engine's database: for each fault, the time
from its start until every worker had written a journal entry after it ended
("every worker progressing again"), and until a run finished after it ended. At the
end, from the engine's tables and the providers' books: how each run ended against
how it was designed to end, effects left IN_PROGRESS, executions beyond one per
idempotency key at the providers, and the time from the end of the last fault until
nothing could move any more without a person. The exit status is 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench import common
from bench.autofailover import AutoFailover
from bench.autofailover import installed as autofailover_installed
from bench.servers import PostgresServer, RedisServer

ENGINE_DB = "saga_bench_faults"
PROVIDERS_DB = os.environ.get(
    "BENCH_FAULTS_PROVIDERS_URL", "postgres://postgres@127.0.0.1:5432/saga_bench_faults_providers"
)
WORKFLOW = "faults_order"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "COMPENSATED")
SAMPLE_INTERVAL = 0.2
RECOVERY_TIMEOUT = 60.0  # a fault not recovered from by then is reported as such; the next one goes ahead
SETTLE_TARGET = 60.0
APPROVAL_DELAY = 1.0
PROVIDER_TIMEOUT = 2.0  # the workers' DEMO_PROVIDER_TIMEOUT
TIMEOUT_FAULT = "timeout_after_work:5"  # longer than PROVIDER_TIMEOUT: the caller gives up, the work stands
TIMEOUT_TARGETS = (("payments", "capture"), ("inventory", "reserve"), ("shipping", "create"))

# Our runs that can still move without a person: not finished, and not parked in NEEDS_ATTENTION
# with a reason and no UNKNOWN effect that the reconciler will look up again.
UNSETTLED_SQL = """
SELECT count(*) FROM sagas_workflowrun r
 WHERE r.workflow_name = %s
   AND NOT (r.status = ANY(%s)
            OR (r.status = 'NEEDS_ATTENTION' AND r.status_reason <> ''
                AND NOT EXISTS (SELECT 1 FROM ledger_effectrecord e
                                 WHERE e.run_id = r.id AND e.status = 'UNKNOWN' AND e.next_check_at IS NOT NULL)))
"""

KILL = "worker SIGKILL (process group)"
PG_FAST = "PostgreSQL restart (-m fast)"
PG_IMMEDIATE = "PostgreSQL restart (-m immediate)"
TERMINATE = "pg_terminate_backend round"
REDIS_RESTART = "Redis restart"
FLUSHALL = "Redis FLUSHALL"
PROVIDER_TIMEOUT_FAULT = "provider timeout (after the work)"
FAILOVER = "primary killed, failover (pg_auto_failover)"
KINDS = (KILL, PG_FAST, PG_IMMEDIATE, TERMINATE, REDIS_RESTART, FLUSHALL, PROVIDER_TIMEOUT_FAULT, FAILOVER)


@dataclass(frozen=True)
class Size:
    runs: int
    workers: int
    planned: tuple[str, ...]  # faults placed evenly over the soak (by share of runs finished)
    kill_filler: bool  # a worker SIGKILL in every gap between planned faults
    gap: tuple[float, float]  # seconds between a recovery and the next fault
    settle_timeout: float
    think: float  # seconds of model-like steps per run: what makes the soak last
    span: tuple[float, float] = (0.05, 0.85)  # the planned faults at lo + (hi - lo) * k / len(planned) of runs finished


FULL = Size(
    runs=1000, workers=4,
    planned=(PG_FAST, PG_IMMEDIATE, PG_FAST) + (TERMINATE,) * 5 + (REDIS_RESTART,) * 2 + (FLUSHALL,)
    + (PROVIDER_TIMEOUT_FAULT,) * 6,
    kill_filler=True, gap=(1.0, 3.0), settle_timeout=180.0, think=0.5,
)
SMOKE = Size(
    runs=40, workers=2, planned=(KILL, PG_FAST, TERMINATE, REDIS_RESTART, PROVIDER_TIMEOUT_FAULT),
    kill_filler=False, gap=(0.5, 1.0), settle_timeout=SETTLE_TARGET + 5, think=1.0,
)
# Failovers only, no worker kills between them (each failover's recovery is its own); the last
# at 70 % of the runs, so the rest of the soak runs on the formation's survivor.
FAILOVER_FULL = Size(
    runs=500, workers=4, planned=(FAILOVER,) * 3, kill_filler=False, gap=(1.0, 3.0), settle_timeout=180.0,
    think=0.5, span=(0.20, 0.95),
)
FAILOVER_SMOKE = Size(
    runs=40, workers=2, planned=(FAILOVER,), kill_filler=False, gap=(0.5, 1.0), settle_timeout=SETTLE_TARGET + 5,
    think=1.0, span=(0.30, 0.90),
)


@dataclass
class Fault:
    kind: str
    started: float  # time.time() when the script began it
    ended: float | None = None  # when it was over (server back, process killed, row consumed)
    detail: str = ""
    every_worker: float | None = None  # time.time() when every worker had progressed since `ended`
    a_run_finished: float | None = None  # time.time() when a run had finished since `ended`
    # A failover's: `ended` is the kill (the old primary's PostgreSQL stopped); then these.
    writable: float | None = None  # time.time() when the new primary accepted writes
    first_step: float | None = None  # the first step journaled on the new primary (its created_at)
    finished_at_kill: int = 0  # runs finished when the primary was killed
    rejoin: float | None = None  # seconds the node killed before took to rejoin, just before this kill

    def recovered(self) -> bool:
        return self.every_worker is not None


# --- the engine's worker processes --------------------------------------------------------


class Workers:
    """``sagas_worker`` processes, one process group each, named ``faults-w1`` ... Each that
    dies without the bench killing it is respawned under its name after a second."""

    RESPAWN_DELAY = 1.0

    def __init__(self, names: list[str], env_for: Any, log_dir: Path) -> None:
        self.names, self.env_for, self.log_dir = names, env_for, log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.kills = 0
        self.exits: list[tuple[str, int]] = []  # (name, exit status) of deaths the bench did not cause
        self._due: dict[str, float] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="supervisor", daemon=True)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _spawn(self, name: str) -> None:
        with open(self.log_path(name), "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} spawn {name}\n".encode())
            log.flush()
            self.procs[name] = subprocess.Popen(
                [sys.executable, "manage.py", "sagas_worker", "--name", name], cwd=common.ROOT,
                env=self.env_for(name), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> None:
        with self.lock:
            for name in self.names:
                self._spawn(name)
        self._thread.start()

    def kill(self, name: str) -> None:
        """SIGKILL the worker's process group and respawn it under the same name at once."""
        with self.lock:
            proc = self.procs[name]
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            self._due.pop(name, None)
            self.kills += 1
            self._spawn(name)

    def _supervise(self) -> None:
        while not self._halt.wait(0.1):
            with self.lock:
                now = time.monotonic()
                for name, proc in self.procs.items():
                    code = proc.poll()
                    if code is not None and name not in self._due:
                        self.exits.append((name, code))
                        self._due[name] = now + self.RESPAWN_DELAY
                for name, due in list(self._due.items()):
                    if now >= due:
                        del self._due[name]
                        self._spawn(name)

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        with self.lock:
            for proc in self.procs.values():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


# --- progress, sampled from the engine's database ----------------------------------------


class Sampler(threading.Thread):
    """Every ``SAMPLE_INTERVAL``: the newest journal entry of each worker name and the newest
    finished run, by their database timestamps. A fault is recovered from when every worker
    has appended an entry since it ended. Reconnects by itself; a failed sample is counted."""

    def __init__(self, dsn: str, names: list[str], all_started: Any) -> None:
        super().__init__(name="sampler", daemon=True)
        self.dsn, self.names, self.all_started = dsn, names, all_started
        self.settled_since: float | None = None  # since when no run of ours could move without a person
        self.lock = threading.Lock()
        self.last_entry = dict.fromkeys(names, 0.0)
        self.last_finished = 0.0
        self.finished = 0  # our runs in a terminal status
        self.faults: list[Fault] = []
        self.samples = self.failed = 0
        self._watermark = 0
        self._conn: psycopg.Connection | None = None
        self._halt = threading.Event()

    def watch(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_INTERVAL):
            try:
                self._sample()
                self.samples += 1
            except psycopg.Error:
                self.failed += 1
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
        if self._conn is not None:
            self._conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def _sample(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2,
                                         application_name="faults-bench-sampler")
        conn = self._conn
        # A few hundred ids back: an entry committed after a newer id was seen is not missed.
        rows = conn.execute(
            """SELECT worker_id, extract(epoch FROM max(created_at))::float8, max(id) FROM sagas_journalentry
                WHERE id > %s AND worker_id = ANY(%s) GROUP BY worker_id""",
            [max(0, self._watermark - 500), self.names],
        ).fetchall()
        finished, last_finished = conn.execute(
            """SELECT count(*) FILTER (WHERE status = ANY(%s)), extract(epoch FROM max(finished_at))::float8
                 FROM sagas_workflowrun WHERE workflow_name = %s""",
            [list(TERMINAL), WORKFLOW],
        ).fetchone()
        started = self.all_started()
        left = conn.execute(UNSETTLED_SQL, [WORKFLOW, list(TERMINAL)]).fetchone()[0] if started else -1
        now = time.time()
        with self.lock:
            if left != 0:
                self.settled_since = None
            elif self.settled_since is None:
                self.settled_since = now
            for worker, newest, max_id in rows:
                self.last_entry[worker] = max(self.last_entry[worker], newest)
                self._watermark = max(self._watermark, max_id)
            self.finished = finished
            self.last_finished = max(self.last_finished, last_finished or 0.0)
            for fault in self.faults:
                if fault.ended is None:
                    continue
                if fault.every_worker is None and all(t >= fault.ended for t in self.last_entry.values()):
                    fault.every_worker = now
                if fault.a_run_finished is None and self.last_finished >= fault.ended:
                    fault.a_run_finished = now


# --- the bench's own clients: starting runs, approving ---------------------------------------


def _drop_connection() -> None:
    from django.db import connection

    try:
        connection.close()
    except Exception:  # noqa: BLE001  (a connection the server already dropped)
        pass


def order(i: int, think: float = 0.0) -> dict[str, Any]:
    """Order ``i``: every 10th waits for an approval, every 20th is undeliverable (compensated);
    its two model-like steps take ``think`` seconds in all."""
    return {
        "id": f"FAULTS-{i:05d}", "sku": f"SKU-{i % 7}", "qty": 1 + i % 3, "approval": i % 10 == 3,
        "address": "" if i % 20 == 7 else "1 Soak Street, Faultville", "think": think,
    }


class Starter(threading.Thread):
    """Starts the runs, keeping about ``backlog`` of them PENDING or RUNNING so that every
    worker has work. A start that fails is retried with the same business key: start() is
    idempotent per key, so an order is never started twice."""

    def __init__(self, runs: int, backlog: int, starter: Any, think: float) -> None:
        super().__init__(name="starter", daemon=True)
        self.runs, self.backlog, self.starter, self.think = runs, backlog, starter, think
        self.ids: dict[int, str] = {}
        self.errors: Counter[str] = Counter()
        self.stop_event = threading.Event()

    def run(self) -> None:
        from sagas import start
        from sagas.models import WorkflowRun

        i = 0
        while i < self.runs and not self.stop_event.is_set():
            try:
                active = WorkflowRun.objects.filter(
                    workflow_name=WORKFLOW, status__in=["PENDING", "RUNNING"]
                ).count()
                for _ in range(max(0, min(self.backlog - active, self.runs - i))):
                    run = start(WORKFLOW, order(i, self.think), business_key=f"faults-{i:05d}",
                                started_by=self.starter)
                    self.ids[i] = str(run.id)
                    i += 1
            except Exception as exc:  # noqa: BLE001  (an outage: counted, retried with the same key)
                self.errors[type(exc).__name__] += 1
                _drop_connection()
                self.stop_event.wait(0.2)
                continue
            self.stop_event.wait(0.05)
        _drop_connection()


class Approver(threading.Thread):
    """Approves every pending approval of ours about ``APPROVAL_DELAY`` after it was requested,
    as a user other than the one who started the run (four-eyes)."""

    def __init__(self, approver: Any) -> None:
        super().__init__(name="approver", daemon=True)
        self.approver = approver
        self.approved = 0
        self.errors: Counter[str] = Counter()
        self.stop_event = threading.Event()

    def run(self) -> None:
        from datetime import timedelta

        from django.utils import timezone

        from sagas.models import ApprovalRequest
        from sagas.waits import approval_decide

        while not self.stop_event.wait(0.3):
            try:
                due = list(ApprovalRequest.objects.filter(
                    state="PENDING", run__workflow_name=WORKFLOW,
                    requested_at__lte=timezone.now() - timedelta(seconds=APPROVAL_DELAY),
                ).values_list("id", flat=True))
                for approval_id in due:
                    approval_decide(approval_id=approval_id, user=self.approver, approve=True, comment="soak")
                    self.approved += 1
            except Exception as exc:  # noqa: BLE001  (an outage, or decided meanwhile: next pass)
                self.errors[type(exc).__name__] += 1
                _drop_connection()
        _drop_connection()


# --- faults -------------------------------------------------------------------------


class Injector:
    """The faults, on the engine's private PostgreSQL server (``pg``) or, in the failover round,
    its pg_auto_failover formation (``paf``: failovers only)."""

    def __init__(self, pg: PostgresServer | None, redis: RedisServer, workers: Workers,
                 providers: psycopg.Connection, rng: random.Random, sampler: Sampler,
                 paf: AutoFailover | None = None) -> None:
        self.pg, self.redis, self.workers, self.providers, self.rng = pg, redis, workers, providers, rng
        self.sampler, self.paf = sampler, paf
        self._timeouts = 0
        self._down: Any = None  # the formation's node killed last, to rejoin before the next kill

    def inject(self, kind: str) -> Fault:
        if kind == FAILOVER:
            return self._failover()
        assert self.pg is not None, kind
        fault = Fault(kind, started=time.time())
        if kind == KILL:
            name = self.rng.choice(self.workers.names)
            self.workers.kill(name)
            fault.detail = name
        elif kind in (PG_FAST, PG_IMMEDIATE):
            self.pg.restart(mode="fast" if kind == PG_FAST else "immediate")
        elif kind == TERMINATE:
            sessions = [b["pid"] for b in self.pg.backends(ENGINE_DB)  # the workers', not the bench's
                        if not (b["application_name"] or "").startswith("faults-bench")]
            chosen = self.rng.sample(sessions, max(1, len(sessions) // 2)) if sessions else []
            ended = self.pg.terminate_backends(ENGINE_DB, pids=chosen) if chosen else 0
            fault.detail = f"{ended} of {len(sessions)} sessions"
        elif kind == REDIS_RESTART:
            self.redis.restart()
        elif kind == FLUSHALL:
            self.redis.flushall()
        elif kind == PROVIDER_TIMEOUT_FAULT:
            provider, operation = TIMEOUT_TARGETS[self._timeouts % len(TIMEOUT_TARGETS)]
            self._timeouts += 1
            (fault_id,) = self.providers.execute(
                """INSERT INTO demo_providerfault (provider, operation, fault, remaining, created_at)
                   VALUES (%s, %s, %s, 1, now()) RETURNING id""", [provider, operation, TIMEOUT_FAULT],
            ).fetchone()
            fault.detail = f"{provider}.{operation}"
            if not common.wait_for(lambda: self._consumed(fault_id), 30, 0.02):
                self.providers.execute("DELETE FROM demo_providerfault WHERE id = %s", [fault_id])
                return fault  # never requested: withdrawn (ended stays None)
        else:
            raise ValueError(kind)
        fault.ended = time.time()
        return fault

    def _failover(self) -> Fault:
        """The primary's host goes down; returns once another node accepts writes. The node
        killed the time before rejoins first (as the secondary: the kill has a standby to fail
        over to), which is not part of this failover's times."""
        assert self.paf is not None
        rejoin = None
        if self._down is not None:
            began = time.monotonic()
            self.paf.rejoin(self._down)
            rejoin, self._down = time.monotonic() - began, None
        with self.sampler.lock:
            finished = self.sampler.finished
        fault = Fault(FAILOVER, started=time.time(), finished_at_kill=finished, rejoin=rejoin)
        old = self.paf.kill_primary()
        fault.ended = time.time()  # its PostgreSQL has stopped (-m immediate returned)
        new = self.paf.wait_new_primary(old)
        fault.writable = time.time()
        self._down = old
        fault.detail = f"{old.name} -> {new.name}"
        return fault

    def _consumed(self, fault_id: int) -> bool:
        return self.providers.execute(
            "SELECT remaining = 0 FROM demo_providerfault WHERE id = %s", [fault_id]
        ).fetchone()[0]


def run_faults(size: Size, injector: Injector, sampler: Sampler, rng: random.Random) -> tuple[list[Fault], list[str]]:
    """Inject the planned faults at evenly spaced shares of the runs finished, one at a time,
    each once the previous one is recovered from (or ``RECOVERY_TIMEOUT`` passed) plus a gap;
    with ``kill_filler``, a worker SIGKILL whenever no planned fault is due. Returns the
    faults and the planned ones that could not be injected (the runs were all done first)."""
    planned = list(size.planned)
    rng.shuffle(planned)
    lo, hi = size.span
    step = (hi - lo) / max(1, len(planned))
    at = [lo + step * k for k in range(len(planned))]
    stop_fillers_at = 0.95
    faults: list[Fault] = []
    moved, seen = time.monotonic(), -1
    not_injected: list[str] = []

    def warm() -> bool:  # every worker has started and appended once: the soak is under way
        with sampler.lock:
            return all(t > 0 for t in sampler.last_entry.values())

    if not common.wait_for(warm, 120, 0.1):
        raise SystemExit("the workers did not start working within 120 s")
    while True:
        with sampler.lock:
            share = sampler.finished / size.runs
        if not planned and not (size.kill_filler and share < stop_fillers_at):
            return faults, not_injected
        if faults:
            last = faults[-1]
            common.wait_for(lambda: last.recovered() or time.time() - last.ended > RECOVERY_TIMEOUT,
                            RECOVERY_TIMEOUT + 5, 0.05)
            time.sleep(rng.uniform(*size.gap))
        while True:
            with sampler.lock:
                share = sampler.finished / size.runs
            if planned and share >= at[0]:
                kind = planned.pop(0)
                at.pop(0)
                break
            if size.kill_filler and share < stop_fillers_at:
                kind = KILL
                break
            if share != seen:
                moved, seen = time.monotonic(), share
            if not planned or share >= 0.999 or time.monotonic() - moved > 2 * RECOVERY_TIMEOUT:
                return faults, not_injected + planned  # done, nothing left to disturb, or nothing moves
            time.sleep(0.1)
        fault = injector.inject(kind)
        if fault.ended is None:  # a provider fault nobody requested: withdrawn, not injected
            not_injected.append(kind)
            continue
        sampler.watch(fault)
        faults.append(fault)
        print(f"  {time.strftime('%H:%M:%S')} {kind} {fault.detail} ({fault.ended - fault.started:.1f} s); "
              f"{share:.0%} of runs finished", file=sys.stderr, flush=True)


# --- the end: settled, and what every run became ---------------------------------------


def wait_settled(sampler: Sampler, since: float, timeout: float) -> float | None:
    """Seconds from ``since`` until every run was started and none could move any more (0 if
    that was already so at ``since`` and stayed so); None if not within ``timeout`` of ``since``."""
    said = time.monotonic()
    while True:
        with sampler.lock:
            settled, finished = sampler.settled_since, sampler.finished
        if settled is not None:
            return max(0.0, settled - since)
        if time.time() - since > timeout:
            return None
        if time.monotonic() - said > 10:
            said = time.monotonic()
            print(f"  {time.strftime('%H:%M:%S')} waiting to settle: {finished} run(s) finished", file=sys.stderr,
                  flush=True)
        time.sleep(SAMPLE_INTERVAL)


@dataclass
class Outcome:
    runs: int
    completed: int = 0
    compensated_by_design: int = 0
    designed_to_compensate: int = 0
    wrong: list[str] = field(default_factory=list)  # FAILED, CANCELLED, or the other end than designed
    attention: Counter[str] = field(default_factory=Counter)  # NEEDS_ATTENTION, by reason
    stuck: list[str] = field(default_factory=list)  # can still move, or parked without a reason
    lost: int = 0  # never started, or started and not in the table
    in_progress: int = 0
    unknown: int = 0
    reconciled: int = 0  # effects settled by a provider lookup after a timeout or a crash
    duplicates: int = 0
    duplicate_keys: list[str] = field(default_factory=list)
    books_mismatch: list[str] = field(default_factory=list)  # the providers' books disagree with the run's end


def measure(starter: Starter, runs: int, providers: psycopg.Connection) -> Outcome:
    from ledger.models import EffectRecord
    from sagas.models import WorkflowRun

    _drop_connection()  # this thread's session did not live through the PostgreSQL restarts
    out = Outcome(runs)
    rows = {r.business_key: r for r in WorkflowRun.objects.filter(workflow_name=WORKFLOW)}
    executed: Counter[str] = Counter()
    for key, n in providers.execute(
        "SELECT idempotency_key, count(*) FROM demo_providerexecution GROUP BY 1"
    ).fetchall():
        executed[key] = n
        if n > 1 or not key:
            out.duplicates += n - 1 if key else n
            out.duplicate_keys.append(f"{key or '(no key)'} x{n}")
    for i in range(runs):
        designed = "COMPENSATED" if order(i)["address"] == "" else "COMPLETED"
        out.designed_to_compensate += designed == "COMPENSATED"
        run = rows.get(f"faults-{i:05d}")
        if i not in starter.ids or run is None:
            out.lost += 1
            continue
        label = f"{run.id} {run.status} {run.status_reason or '-'}: {str((run.error or {}).get('message', ''))[:300]}"
        if run.status == designed:
            out.completed += designed == "COMPLETED"
            out.compensated_by_design += designed == "COMPENSATED"
            expected = {"capture": 1, "reserve": 1, "ship": 1, "capture:compensate": 0, "reserve:compensate": 0}
            if designed == "COMPENSATED":
                expected.update({"ship": 0, "capture:compensate": 1, "reserve:compensate": 1})
            got = {step: executed[f"{run.id}:{step}"] for step in expected}
            if got != expected:
                out.books_mismatch.append(f"{run.id} {run.status}: executed {got}")
        elif run.status in TERMINAL:
            out.wrong.append(label)
        elif run.status == "NEEDS_ATTENTION" and run.status_reason:
            out.attention[run.status_reason] += 1
        else:
            out.stuck.append(label)
    out.in_progress = EffectRecord.objects.filter(status="IN_PROGRESS").count()
    out.unknown = EffectRecord.objects.filter(status="UNKNOWN").count()
    out.reconciled = EffectRecord.objects.filter(resolution="lookup").count()
    return out


def first_steps(dsn: str, faults: list[Fault]) -> None:
    """Each failover's first step journaled on its new primary: the earliest ``step`` entry
    dated after its kill (none can be dated between the kill and the promotion: the old
    primary is down and the new one refuses writes until then)."""
    kills = [f for f in faults if f.kind == FAILOVER and f.ended is not None]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5, application_name="faults-bench") as conn:
        for fault in kills:
            fault.first_step = conn.execute(
                """SELECT extract(epoch FROM min(created_at))::float8 FROM sagas_journalentry
                    WHERE kind = 'step' AND created_at > to_timestamp(%s)""", [fault.ended],
            ).fetchone()[0]


# --- report ----------------------------------------------------------------------------


def seconds(values: list[float], p: float) -> str:
    return f"{common.percentile(values, p):.1f} s" if values else "-"


def since(fault: Fault, moment: float | None, digits: int = 1) -> str:
    return f"{moment - fault.ended:.{digits}f} s" if moment is not None and fault.ended is not None else "never"


def report(size: Size, faults: list[Fault], not_injected: list[str], out: Outcome, settle: float | None,
           lease_ttl: float, sweep: float, wall: float, where: str = "") -> list[str]:
    """Print the tables; the targets missed (empty: all met)."""
    rows = [("fault", "injected", "every worker progressing again: p50", "max", "a run finished again: p50", "max",
             "not recovered within 60 s")]
    for kind in KINDS:
        mine = [f for f in faults if f.kind == kind]
        if not mine:
            continue
        workers = [f.every_worker - f.started for f in mine if f.every_worker is not None]
        finished = [f.a_run_finished - f.started for f in mine if f.a_run_finished is not None]
        rows.append((kind, str(len(mine)), seconds(workers, 50), seconds(workers, 100), seconds(finished, 50),
                     seconds(finished, 100), str(len(mine) - len(workers))))
    common.print_table(
        f"Faults ({size.runs} runs, {size.workers} worker processes{where}, lease {lease_ttl:g} s, sweep every "
        f"{sweep:g} s, provider timeout {PROVIDER_TIMEOUT:g} s; times from the start of each fault, sampled every "
        f"{SAMPLE_INTERVAL:g} s)", rows,
    )
    failovers = [f for f in faults if f.kind == FAILOVER]
    if failovers:
        rows = [("failover", "killed -> promoted", "runs finished at the kill", "new primary writable",
                 "first step journaled on it", "every worker progressing again", "a run finished again",
                 "the node killed before rejoined in")]
        for k, f in enumerate(failovers, 1):
            rows.append((str(k), f.detail, f"{f.finished_at_kill} of {size.runs}", since(f, f.writable, 2),
                         since(f, f.first_step, 2), since(f, f.every_worker), since(f, f.a_run_finished),
                         f"{f.rejoin:.1f} s" if f.rejoin is not None else "-"))
        if len(failovers) > 1:
            def mid(field_name: str, digits: int = 1) -> str:
                values = [getattr(f, field_name) - f.ended for f in failovers
                          if getattr(f, field_name) is not None and f.ended is not None]
                return f"{common.median(values):.{digits}f} s" if values else "-"
            rejoins = [f.rejoin for f in failovers if f.rejoin is not None]
            rows.append(("median", "", "", mid("writable", 2), mid("first_step", 2), mid("every_worker"),
                         mid("a_run_finished"), f"{common.median(rejoins):.1f} s" if rejoins else "-"))
        common.print_table(
            "Failovers (times from the kill: the old primary's keeper SIGKILLed and its PostgreSQL stopped "
            "-m immediate; the node killed before rejoined as the secondary first)", rows,
        )
    settled = f"{settle:.1f}" if settle is not None else f"not within {size.settle_timeout:g}"
    attention = ", ".join(f"{n} {reason}" for reason, n in sorted(out.attention.items())) or "0"
    designed_complete = out.runs - out.designed_to_compensate
    figures = [
        ("figure", "measured", "target"),
        ("runs COMPLETED", f"{out.completed} of {designed_complete}", "-"),
        ("runs COMPENSATED by design", f"{out.compensated_by_design} of {out.designed_to_compensate}", "-"),
        ("runs FAILED wrongly (or ended other than designed)", str(len(out.wrong)), "0"),
        ("runs in NEEDS_ATTENTION with a reason in the console", attention, "-"),
        ("runs stuck without an attention item", str(len(out.stuck)), "0"),
        ("runs lost (not started, or missing)", str(out.lost), "0"),
        ("effects left IN_PROGRESS", str(out.in_progress), "0"),
        ("effects left UNKNOWN", str(out.unknown), "-"),
        ("effects settled by a provider lookup", str(out.reconciled), "-"),
        ("duplicate executions at the providers", str(out.duplicates), "0"),
        ("runs whose provider books disagree with their end", str(len(out.books_mismatch)), "0"),
        ("seconds from the end of the last fault until everything settled", settled, f"<= {SETTLE_TARGET:g}"),
    ]
    common.print_table(f"Outcome ({wall:.0f} s in all)", figures)
    missed = []
    if out.wrong:
        missed.append(f"{len(out.wrong)} run(s) FAILED wrongly")
    if out.stuck:
        missed.append(f"{len(out.stuck)} run(s) stuck without an attention item")
    if out.lost:
        missed.append(f"{out.lost} run(s) lost")
    if out.in_progress:
        missed.append(f"{out.in_progress} effect(s) left IN_PROGRESS")
    if out.duplicates:
        missed.append(f"{out.duplicates} duplicate execution(s)")
    if out.books_mismatch:
        missed.append(f"{len(out.books_mismatch)} run(s) whose provider books disagree")
    if settle is None or settle > SETTLE_TARGET:
        missed.append(f"not settled within {SETTLE_TARGET:g} s of the last fault")
    if not_injected:
        missed.append(f"faults planned but not injected (the runs were done first): {', '.join(not_injected)}")
    print("Targets: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    return missed


def diagnose(out: Outcome, workers: Workers, starter: Starter, approver: Approver, sampler: Sampler,
             log_dir: Path, out_missed: bool) -> None:
    """What the lead needs when a target is missed: which runs, how the workers died, the logs."""
    err = sys.stderr
    print(f"\nworkers killed by the bench: {workers.kills}; died on their own (respawned): {len(workers.exits)} "
          f"{Counter(n for n, _ in workers.exits).most_common()} exit statuses {Counter(c for _, c in workers.exits)}",
          file=err)
    print(f"start() errors (retried): {dict(starter.errors)}; approvals given: {approver.approved}, "
          f"approval errors (retried): {dict(approver.errors)}; samples {sampler.samples}, failed {sampler.failed}",
          file=err)
    for title, items in (("ended other than designed", out.wrong), ("stuck", out.stuck),
                         ("provider books disagree", out.books_mismatch), ("duplicate keys", out.duplicate_keys)):
        if items:
            print(f"{title} ({len(items)}), first ones:", file=err)
            for item in items[:8]:
                print(f"  {item}", file=err)
    errors: Counter[str] = Counter()
    for path in sorted(log_dir.glob("faults-w*.log")):
        for line in path.read_text(errors="replace").splitlines():
            head = line.split(":", 1)[0].strip()
            if head.endswith(("Error", "Exception", "Lost", "Unknown")) and " " not in head:
                errors[head] += 1
    if errors:
        print(f"exception lines in the worker logs: {errors.most_common(12)}", file=err)
    print(f"worker logs: {log_dir}" + ("" if out_missed else " (deleted: every target met)"), file=err)


# --- set-up ---------------------------------------------------------------------------


PROVIDERS_SLOTS = 4
_providers_lock: list[psycopg.Connection] = []  # held open for the process's life


def prepare_providers() -> tuple[psycopg.Connection, str]:
    """The providers' database on the shared server (created and migrated once, emptied) and its
    URL. Two soaks at once (the suite's smoke beside a full run) must not empty each other's books
    or take each other's injected faults: each holds a session advisory lock for its database as
    long as it runs, and one that finds it taken uses the next database (``..._2``, ``..._3``)."""
    base, _, query = PROVIDERS_DB.partition("?")
    lock = psycopg.connect(psycopg.conninfo.make_conninfo(PROVIDERS_DB, dbname="postgres"), autocommit=True,
                           application_name="faults-bench-lock")
    for slot in range(1, PROVIDERS_SLOTS + 1):
        if lock.execute("SELECT pg_try_advisory_lock(hashtext('saga_bench_faults_providers'), %s)",
                        [slot]).fetchone()[0]:
            break
    else:
        raise SystemExit(f"{PROVIDERS_SLOTS} fault soaks are running already")
    _providers_lock.append(lock)
    url = base + (f"_{slot}" if slot > 1 else "") + (f"?{query}" if query else "")
    env = common.bench_env(DATABASE_URL=url)
    for args in (["sagas_ensuredb"], ["migrate", "-v0"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=common.ROOT, env=env, check=True)
    conn = psycopg.connect(url, autocommit=True, application_name="faults-bench")
    conn.execute("TRUNCATE demo_providerexecution, demo_providerreplay, demo_providerfault CASCADE")
    return conn, url


def release_providers() -> None:
    while _providers_lock:
        _providers_lock.pop().close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="40 runs, 2 workers, one fault of most kinds")
    parser.add_argument("--failover", action="store_true",
                        help="only the failover round: the engine on a pg_auto_failover formation, its primary killed")
    parser.add_argument("--no-failover", action="store_true", help="only the first round (no formation)")
    parser.add_argument("--failovers", type=int, default=None, help="primary kills in the failover round (default 3)")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="SAGAS_LEASE_TTL of the workers (default 5)")
    parser.add_argument("--sweep-interval", type=float, default=0.5, help="SAGAS_SWEEP_INTERVAL (default 0.5)")
    parser.add_argument("--think", type=float, default=None, help="seconds of model-like steps per run")
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args()
    environ = dict(os.environ)  # before this round configures Django into it
    if args.failover and args.no_failover:
        parser.error("--failover and --no-failover exclude each other")
    if args.failover:
        size = FAILOVER_SMOKE if args.smoke else FAILOVER_FULL
        if args.failovers is not None:
            size = replace(size, planned=(FAILOVER,) * args.failovers)
    else:
        size = SMOKE if args.smoke else FULL
    size = replace(size, runs=args.runs or size.runs, workers=args.workers or size.workers,
                   think=size.think if args.think is None else args.think)
    status = soak(size, args, failover=args.failover)
    if not (args.failover or args.no_failover or args.smoke) and not autofailover_installed():
        print("The failover round is left out: it needs pg_auto_failover (Debian: postgresql-15-auto-failover).",
              file=sys.stderr)
    elif not (args.failover or args.no_failover or args.smoke):
        # The failover round in a process of its own: Django is configured once per process,
        # and this one's engine database was the first round's server, now gone.
        sys.stdout.flush()
        again = [sys.executable, str(Path(__file__).resolve()), "--failover", "--seed", str(args.seed),
                 "--lease-ttl", str(args.lease_ttl), "--sweep-interval", str(args.sweep_interval)]
        if args.failovers is not None:
            again += ["--failovers", str(args.failovers)]
        status = max(status, subprocess.run(again, cwd=common.ROOT, env=environ).returncode)
    return status


def soak(size: Size, args: argparse.Namespace, *, failover: bool) -> int:
    """One round: the engine on a private PostgreSQL server, or on a pg_auto_failover formation.
    0 when every target was met."""
    rng = random.Random(args.seed)
    began = time.time()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    if failover and not autofailover_installed():
        raise SystemExit("--failover needs pg_auto_failover (Debian: postgresql-15-auto-failover)")
    pg = None if failover else PostgresServer()
    paf = AutoFailover(ENGINE_DB) if failover else None
    redis = RedisServer()
    providers_proc = None
    workers = sampler = starter = approver = None
    missed: list[str] = ["did not finish"]
    try:
        if paf is not None:
            paf.start()
            engine_url = paf.uri()
            where_db = (f"pg_auto_failover formation (monitor :{paf.monitor.port}, nodes "
                        f"{', '.join(f':{n.port}' for n in paf.nodes)})")
            where = ", on a pg_auto_failover formation (synchronous secondary)"
        else:
            assert pg is not None
            pg.start()
            engine_url = pg.url(ENGINE_DB)
            where_db, where = f"PostgreSQL :{pg.port}", ""
        redis.start()
        providers, providers_db = prepare_providers()
        env = dict(
            REDIS_URL=redis.url(0), SAGAS_MODULES="bench.faults_workflows", SAGAS_LEASE_TTL=str(args.lease_ttl),
            SAGAS_SWEEP_INTERVAL=str(args.sweep_interval), DEMO_PROVIDER_TIMEOUT=str(PROVIDER_TIMEOUT),
            SAGAS_LOG_LEVEL="WARNING",
        )
        providers_proc, providers_url = common.start_providers(common.bench_env(DATABASE_URL=providers_db))
        env["DEMO_PROVIDERS_URL"] = providers_url
        query = "&" if "?" in engine_url else "?"
        common.setup_django(DATABASE_URL=f"{engine_url}{query}application_name=faults-bench", **env)
        if pg is not None:
            # bench/servers.py turns synchronous_commit off for speed; a crash (-m immediate) could then
            # lose commits already acknowledged, which no production database does. On for the engine's.
            # (The formation keeps it on: a commit waits for the synchronous secondary.)
            with pg.connect() as conn:
                conn.execute(f"ALTER DATABASE {ENGINE_DB} SET synchronous_commit = on")
        _drop_connection()
        from django.contrib.auth import get_user_model

        users = get_user_model().objects
        starter_user = users.get_or_create(username="faults-starter")[0]
        approver_user = users.get_or_create(username="faults-approver")[0]

        names = [f"faults-w{k}" for k in range(1, size.workers + 1)]
        workers = Workers(
            names, lambda name: common.bench_env(DATABASE_URL=engine_url, **env), log_dir
        )
        starter = Starter(size.runs, backlog=3 * size.workers + 4, starter=starter_user, think=size.think)
        sampler = Sampler(engine_url, names, all_started=lambda: len(starter.ids) == size.runs)
        approver = Approver(approver_user)
        print(f"{time.strftime('%H:%M:%S')} fault soak: {size.runs} runs, {size.workers} workers; engine {where_db}, "
              f"Redis :{redis.port}; providers on {providers_db.partition('?')[0].rsplit('/', 1)[1]} (shared server); logs {log_dir}",
              file=sys.stderr, flush=True)
        workers.start()
        sampler.start()
        starter.start()
        approver.start()
        injector = Injector(pg, redis, workers, providers, rng, sampler, paf)
        faults, not_injected = run_faults(size, injector, sampler, rng)
        last_end = max((f.ended for f in faults if f.ended is not None), default=time.time())
        settle = wait_settled(sampler, last_end, size.settle_timeout)
        time.sleep(2 * SAMPLE_INTERVAL)  # a last sample for the last fault's recovery
        sampler.stop()
        starter.stop_event.set()
        approver.stop_event.set()
        if paf is not None:
            first_steps(engine_url, faults)
        out = measure(starter, size.runs, providers)
        missed = report(size, faults, not_injected, out, settle, args.lease_ttl, args.sweep_interval,
                        time.time() - began, where)
        diagnose(out, workers, starter, approver, sampler, log_dir, bool(missed))
    except BaseException:
        traceback.print_exc()
        missed = ["the bench itself failed"]
    finally:
        if missed:  # the server's logs beside the workers' (the formation's: its keepers')
            for path in [pg.log_path] if pg is not None else [n.log_path for n in [paf.monitor, *paf.nodes]]:
                if path.exists():
                    shutil.copy(path, log_dir / (path.name if pg is None else "postgres.log"))
        # Each step on its own: a failing one must not leave workers or servers behind.
        for thread in (starter, approver):
            if thread is not None:
                thread.stop_event.set()
        steps = [sampler.stop if sampler is not None else None, workers.stop if workers is not None else None,
                 providers_proc.kill if providers_proc is not None else None,
                 pg.cleanup if pg is not None else None, paf.cleanup if paf is not None else None, redis.cleanup,
                 release_providers]
        for step in filter(None, steps):
            try:
                step()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    if not missed:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Dispatch latency (idle, and beside a busy worker), recovery after SIGKILL, and scaling
from one worker process to two; and the /proc sampler that bench/engine.py uses for CPU per step.

    .venv/bin/python bench/engine_extra.py            # full sizes: 9 minutes at load 4-7 on 2 cores
    .venv/bin/python bench/engine_extra.py --smoke    # tiny sizes: checks the script

``bench/engine.py`` adds ``measure()``'s rows to its table; run alone, this prints them
in a table of the same columns. Every figure comes from real ``sagas_worker``
processes, each in its own session, on real PostgreSQL and Redis. Each function's
docstring says what exactly is timed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

PURE_STEPS = 20  # steps of one bench_pure20 run
SWEEP_INTERVAL = 2.0  # the product default
LEASE_TTL = 3.0  # the bench's lease: 20 kills at the product's 15 s would take 6 minutes
WARMUP = 5  # dispatch samples discarded: psycopg prepares a statement on its 5th use
STEP_SLEEP = 0.02  # of each bench_sleepy step
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Workers:
    """The worker processes of one measurement. Leaving the block SIGKILLs the process
    group of every one not yet reaped and reaps it, also when the measurement failed;
    their stderr is then printed, since it usually says why."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[int, subprocess.Popen] = {}

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = common.spawn_worker(*args, env=env or self.env)
        self.procs[proc.pid] = proc
        return proc

    def spawn_command(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Any other process of the measurement (the busy worker's feeder), in its own session."""
        proc = subprocess.Popen(command, cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.procs[proc.pid] = proc
        return proc

    def kill(self, pid: int) -> None:
        proc = self.procs.pop(pid)
        if proc.poll() is None:  # not reaped, so the group id cannot belong to anyone else yet
            os.killpg(pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        procs = list(self.procs.values())
        for proc in procs:
            self.kill(proc.pid)
            if exc_type is not None:
                sys.stderr.write(f"--- worker {proc.pid} ---\n{proc.stderr.read().decode(errors='replace')[-3000:]}\n")


def _wait(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> None:
    if not common.wait_for(predicate, timeout, interval):
        raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def _wait_listening(proc: subprocess.Popen) -> None:
    """Until the worker (concurrency 1) is registered with RQ as idle: blocked in its dequeue."""
    from rq import Worker

    from sagas.runtime.queue import redis_connection

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"worker {proc.pid} exited with {proc.returncode}")
        return any(w.pid == proc.pid and w.get_state() == "idle" for w in Worker.all(connection=redis_connection()))

    _wait(listening, 60, f"worker {proc.pid} to listen", interval=0.1)


def _completed(run_id: object) -> bool:
    from sagas.models import WorkflowRun

    return WorkflowRun.objects.filter(id=run_id, status="COMPLETED").exists()


@dataclass(frozen=True)
class Dispatch:
    """One dispatch, in seconds, cut at the claim (the claim statement's ``now()``)."""

    start_call: float  # start() itself: insert and commit, marker and RQ enqueue
    to_claim: float  # start() returned -> claim began: BLPOP wake-up, RQ job preamble, marker delete
    to_step: float  # claim began -> first step began: claim, journal load, replay set-up

    @property
    def total(self) -> float:
        return self.start_call + self.to_claim + self.to_step


BUSY_QUEUE = "sagas_busy"  # SAGAS_QUEUE of the busy worker and its feeder
BUSY_MODULES = "bench.workflows_busy"  # and their only workflow: the measured worker has no code for it
BUSY_BACKLOG = 10  # bench_busy20 runs the feeder keeps waiting for the busy worker (about 0.3 s of work)


@dataclass(frozen=True)
class DispatchRun:
    """One measurement of ``samples`` dispatches, and the load beside it (0 when idle)."""

    samples: list[Dispatch]
    busy_steps_per_s: float  # pure steps/s the busy worker journaled meanwhile

    @property
    def p95_ms(self) -> float:
        return 1000 * common.percentile([d.total for d in self.samples], 95)


def dispatch_samples(samples: int, *, busy: bool = False) -> DispatchRun:
    """One warmed-up worker at concurrency 1, sweeping every 2 s as in production.
    Runs go one at a time, each after a random pause of 50 to 250 ms, so the worker is
    blocked in its dequeue when the wake-up arrives, not working off a backlog.

    ``busy``: meanwhile another worker process (concurrency 1, no sweep) drains
    ``bench_busy20`` runs that a feeder process keeps ``BUSY_BACKLOG`` deep. Both use their
    own queue prefix (``SAGAS_QUEUE``) and load only their own workflow (``SAGAS_MODULES``:
    the fast dispatch path hands a run to any worker with its code), so the measured worker
    stays idle between its samples: the load is the machine's (CPU, PostgreSQL, Redis), not
    a queue to wait in.
    The journal is checked afterwards: each worker claimed only its own kind of run."""
    from sagas import start
    from sagas.models import JournalEntry, WorkflowRun

    common.reset_state()
    results: list[Dispatch] = []
    with Workers(common.bench_env()) as workers:
        measured = workers.spawn("--name", "bench-dispatch")
        if busy:
            busy_env = common.bench_env(SAGAS_QUEUE=BUSY_QUEUE, SAGAS_MODULES=BUSY_MODULES)
            loader = workers.spawn("--no-sweep", "--name", "bench-busy", env=busy_env)
            workers.spawn_command([sys.executable, str(Path(__file__).resolve()), "--feed", str(BUSY_BACKLOG)],
                                  busy_env)
            _wait_listening(loader)
            _wait(lambda: WorkflowRun.objects.filter(workflow_name="bench_busy20", status="COMPLETED").exists(),
                  60, "the busy worker to complete a run")
        _wait_listening(measured)
        t_begin = time.time()
        for i in range(WARMUP + samples):
            time.sleep(random.uniform(0.05, 0.25))
            t0 = time.time()
            run = start("bench_dispatch", {})
            t1 = time.time()
            _wait(partial(_completed, run.id), 10, f"dispatch run {run.id}")
            stepped = WorkflowRun.objects.values_list("result", flat=True).get(id=run.id)
            claimed = JournalEntry.objects.get(run_id=run.id, kind="claimed").created_at.timestamp()
            if i >= WARMUP:
                results.append(Dispatch(t1 - t0, claimed - t1, stepped - claimed))
        t_end = time.time()
    return DispatchRun(results, _busy_check(t_begin, t_end) if busy else 0.0)


def _busy_check(t_begin: float, t_end: float) -> float:
    """Pure steps/s journaled by the busy worker between ``t_begin`` and ``t_end``; raises if
    a worker claimed the other's kind of run (the measured worker would not have been idle)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("""SELECT r.workflow_name, split_part(j.worker_id, '/', 1), count(*)
                         FROM sagas_journalentry j JOIN sagas_workflowrun r ON r.id = j.run_id
                        WHERE j.kind = 'claimed' GROUP BY 1, 2""")
        claims = {(name, who): n for name, who, n in cur.fetchall()}
        cur.execute("""SELECT count(*) FROM sagas_journalentry j JOIN sagas_workflowrun r ON r.id = j.run_id
                        WHERE r.workflow_name = 'bench_busy20' AND j.kind = 'step'
                          AND j.created_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)""", [t_begin, t_end])
        (steps,) = cur.fetchone()
    if set(claims) - {("bench_dispatch", "bench-dispatch"), ("bench_busy20", "bench-busy")}:
        raise RuntimeError(f"a worker claimed a run of the other's kind: {claims}")
    return steps / (t_end - t_begin)


def feed(backlog: int) -> None:
    """The busy worker's feeder (``--feed``): keeps ``backlog`` bench_busy20 runs not yet
    completed, started five at a time in one transaction, until it is killed."""
    from django.db import transaction

    import bench.workflows_busy  # noqa: F401  (registers bench_busy20: setup_django loads bench.workflows only)
    from sagas import start
    from sagas.models import WorkflowRun

    while True:
        waiting = WorkflowRun.objects.filter(workflow_name="bench_busy20").exclude(status="COMPLETED").count()
        if waiting < backlog:
            with transaction.atomic():
                for _ in range(5):
                    start("bench_busy20", {})
        else:
            time.sleep(0.02)


def dispatch_latency(samples: int) -> list[float]:
    """Seconds from just before ``start()`` to the first step executing, one per sample."""
    return [d.total for d in dispatch_samples(samples).samples]


def _stamps(run_id: object) -> list[tuple[float, int]]:
    """(began, pid) of each journaled step of a bench_sleepy run, in order."""
    from sagas.models import JournalEntry

    payloads = JournalEntry.objects.filter(run_id=run_id, kind="step").order_by("seq").values_list("payload", flat=True)
    return [(p["value"][0], int(p["value"][1])) for p in payloads]


def _has_steps(run_id: object, count: int) -> bool:
    return len(_stamps(run_id)) >= count


def _first_step_elsewhere(run_id: object, pid: int) -> float | None:
    """When the first step journaled by a process other than ``pid`` began, if any yet."""
    return next((began for began, by in _stamps(run_id) if by != pid), None)


@dataclass(frozen=True)
class Recovery:
    total: float  # SIGKILL -> the next step began on another process, seconds
    lease_left: float  # of that, the lease still to run at the kill; the rest is sweep + dispatch


def recovery_samples(kills: int, lease_ttl: float) -> list[Recovery]:
    """Two workers, each sweeping every ``SWEEP_INTERVAL`` (the product default: the
    target's "+ 2 s"). A fresh run of 20 ms steps starts; once its owner has journaled 3
    steps, and after a random delay of up to one lease renewal period (ttl/3), so the
    kill lands anywhere in the renewal cycle, that worker's process group is SIGKILLed
    at ``t_kill`` and, as a supervisor would, respawned at once. ``t_next`` is when the
    first step journaled by another process began. Each run completes before the next
    starts, so a worker is idle."""
    from sagas import start
    from sagas.models import WorkflowRun

    common.reset_state()
    env = common.bench_env(SAGAS_LEASE_TTL=f"{lease_ttl:g}", SAGAS_SWEEP_INTERVAL=f"{SWEEP_INTERVAL:g}")
    spec = {"steps": round(lease_ttl / 3 / STEP_SLEEP) + 40, "sleep": STEP_SLEEP}
    results: list[Recovery] = []
    with Workers(env) as workers:
        for proc in [workers.spawn(), workers.spawn()]:
            _wait_listening(proc)
        for _ in range(kills):
            run = start("bench_sleepy", spec)
            _wait(partial(_has_steps, run.id, 3), 30, f"run {run.id} to take 3 steps")
            time.sleep(random.uniform(0, lease_ttl / 3))
            victim = _stamps(run.id)[-1][1]
            t_kill = time.time()
            workers.kill(victim)
            expires = WorkflowRun.objects.values_list("lease_expires_at", flat=True).get(id=run.id)
            replacement = workers.spawn()
            _wait(partial(_first_step_elsewhere, run.id, victim), lease_ttl + 60, f"run {run.id} to recover")
            t_next = _first_step_elsewhere(run.id, victim)
            assert t_next is not None
            results.append(Recovery(t_next - t_kill, expires.timestamp() - t_kill))
            _wait(partial(_completed, run.id), 60, f"run {run.id} to complete")
            _wait_listening(replacement)
    return results


def recovery_times(kills: int, lease_ttl: float) -> list[float]:
    """Seconds from a SIGKILL of the worker running a run to its next step on another worker."""
    return [r.total for r in recovery_samples(kills, lease_ttl)]


def _ticks(pid: int) -> int | None:
    """utime + stime of a process in clock ticks; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def _cpu(groups: dict[str, list[int]], last: dict[tuple[str, int], int]) -> dict[str, int]:
    """Ticks used so far by each group of processes; ``last`` keeps every process's latest
    reading, so one that has exited still counts."""
    for group, pids in groups.items():
        for pid in pids:
            if (ticks := _ticks(pid)) is not None:
                last[group, pid] = ticks
    return {g: sum(t for (group, _), t in last.items() if group == g) for g in groups}


def _machine() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot; idle, I/O wait and steal are not busy."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4] - fields[7], sum(fields)


@dataclass(frozen=True)
class Cpu:
    """CPU per step over a window, by process group, in ms; and the machine's busy share."""

    worker_ms: float  # the worker processes
    backend_ms: float  # their PostgreSQL backends (fdatasync included)
    redis_ms: float  # the whole Redis server, shared with whatever else uses it
    busy: float  # share of the machine's CPUs busy, other people's work included


NO_CPU = Cpu(*(float("nan"),) * 4)


class CpuSampler:
    """Reads ``/proc`` (call ``sample()`` every 0.1 s): CPU ticks of the worker processes,
    of every client backend of the bench database but the bench's own, and of Redis.

    Backends are listed from ``pg_stat_activity`` over a connection of its own to the
    ``postgres`` database, so the sampling adds no commit to the bench database's
    ``xact_commit`` (bench/engine.py counts commits per step over the same window)."""

    def __init__(self, worker_pids: list[int]) -> None:
        import psycopg
        from django.db import connection

        from sagas.runtime.queue import redis_connection

        connection.ensure_connection()  # its backend is excluded; connecting commits nothing
        self.worker_pids = worker_pids
        self.redis_pid = int(redis_connection().info("server")["process_id"])
        params = connection.get_connection_params()
        self.database = connection.settings_dict["NAME"]
        self.own = connection.connection.info.backend_pid if connection.connection else 0
        self.conn = psycopg.connect(dbname="postgres", autocommit=True,
                                    **{k: v for k, v in params.items() if k in {"host", "port", "user", "password"}})
        self.last: dict[tuple[str, int], int] = {}  # (group, pid) -> latest ticks seen
        self.samples: list[tuple[float, dict[str, int], tuple[int, int]]] = []

    def sample(self) -> None:
        backends = [pid for (pid,) in self.conn.execute(
            """SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'
                  AND pid <> %s""", [self.database, self.own]).fetchall()]
        groups = {"worker": self.worker_pids, "backend": backends, "redis": [self.redis_pid]}
        self.samples.append((time.time(), _cpu(groups, self.last), _machine()))

    def close(self) -> None:
        self.conn.close()

    def per_step(self, first: float, last: float, steps_per_s: float) -> Cpu:
        """CPU per step between the first and last samples inside ``[first, last]`` (epoch
        seconds, e.g. first claim and last completion), at ``steps_per_s``."""
        inside = [s for s in self.samples if first <= s[0] <= last]
        if len(inside) < 2:  # a round too short to sample (smoke sizes)
            return NO_CPU
        (t_a, cpu_a, (busy_a, all_a)), (t_b, cpu_b, (busy_b, all_b)) = inside[0], inside[-1]
        steps = steps_per_s * (t_b - t_a)

        def ms(group: str) -> float:
            return 1000 * (cpu_b[group] - cpu_a[group]) / CLK_TCK / steps

        return Cpu(ms("worker"), ms("backend"), ms("redis"), (busy_b - busy_a) / (all_b - all_a))


@dataclass(frozen=True)
class ScalingRound:
    """A round's throughput and, over the same window, CPU per step by process group."""

    steps_per_s: float
    cpu: Cpu


def _scaling_round(runs: int, processes: int, concurrency: int) -> ScalingRound:
    """Steps/s of ``bench_pure20`` runs, from the journal's first claim to its last
    completion, as in ``bench/engine.py``. The workers (``--no-sweep``) listen before the
    runs exist, so each takes work from the first claim; the runs are created in one
    transaction, and their wake-ups go out as it commits. ``/proc`` is sampled every
    0.1 s meanwhile, to show where the CPU goes."""
    from django.db import connection, transaction

    from sagas import start
    from sagas.models import WorkflowRun

    common.reset_state()
    deadline = time.monotonic() + 600
    with Workers(common.bench_env()) as workers:
        procs = [workers.spawn("--no-sweep", "--concurrency", str(concurrency)) for _ in range(processes)]
        for proc in procs:
            _wait_listening(proc)
        sampler = CpuSampler([p.pid for p in procs])
        try:
            with transaction.atomic():
                for _ in range(runs):
                    start("bench_pure20", {})
            while WorkflowRun.objects.filter(status="COMPLETED").count() < runs:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{processes} worker(s) did not complete {runs} runs")
                sampler.sample()
                time.sleep(0.1)
        finally:
            sampler.close()
    with connection.cursor() as cur:
        cur.execute("""SELECT count(DISTINCT split_part(worker_id, '/', 1)) FILTER (WHERE kind = 'claimed'),
                              min(created_at) FILTER (WHERE kind = 'claimed'),
                              max(created_at) FILTER (WHERE kind = 'completed')
                         FROM sagas_journalentry WHERE kind IN ('claimed', 'completed')""")
        claimers, first, last_done = cur.fetchone()
    if claimers != processes:
        raise RuntimeError(f"runs were claimed by {claimers} worker processes, not {processes}")
    steps_per_s = runs * PURE_STEPS / (last_done - first).total_seconds()
    return ScalingRound(steps_per_s, sampler.per_step(first.timestamp(), last_done.timestamp(), steps_per_s))


def scaling_rounds(runs: int, rounds: int, *, concurrency: int = 1) -> tuple[list[ScalingRound], list[ScalingRound]]:
    """Rounds alternate, one process then two, so drift in the machine's load hits both."""
    pairs = [(_scaling_round(runs, 1, concurrency), _scaling_round(runs, 2, concurrency)) for _ in range(rounds)]
    return [one for one, _ in pairs], [two for _, two in pairs]


def scaling(runs: int, rounds: int, *, concurrency: int = 1) -> tuple[list[float], list[float]]:
    """Pure steps/s per round with one worker process, and with two, each at ``concurrency``."""
    one, two = scaling_rounds(runs, rounds, concurrency=concurrency)
    return [r.steps_per_s for r in one], [r.steps_per_s for r in two]


def _p(values: list[float], scale: float, fmt: str) -> str:
    return f"{common.percentile(values, 50) * scale:{fmt}} / {common.percentile(values, 95) * scale:{fmt}}"


def _breakdown(runs: list[DispatchRun]) -> str:
    dispatch = [d for r in runs for d in r.samples]
    return ("start() " + _p([d.start_call for d in dispatch], 1000, ".1f")
            + "; to claim (from start() returning: the NOTIFY wake-up, or RQ's when the fast thread is busy; negative when the claim began before start() returned) " + _p([d.to_claim for d in dispatch], 1000, ".1f")
            + "; claim to first step " + _p([d.to_step for d in dispatch], 1000, ".1f"))


@dataclass(frozen=True)
class Extra:
    rows: list[tuple[str, ...]]  # (figure, one cell per concurrency, target)
    notes: list[str]  # lines to print under the table
    idle: list[DispatchRun]  # dispatch runs with an idle worker
    loaded: list[DispatchRun]  # the same beside one busy worker, alternating with them
    scaled: dict[int, tuple[list[ScalingRound], list[ScalingRound]]]  # concurrency -> (1 process, 2)


def measure(*, smoke: bool, concurrencies: tuple[int, ...] = (1, 4)) -> Extra:
    """Dispatch (idle and beside a busy worker, alternating), recovery, scaling with CPU per step."""
    samples, dispatch_runs, kills, runs, rounds = (5, 1, 1, 10, 1) if smoke else (100, 5, 20, 250, 5)
    idle: list[DispatchRun] = []
    loaded: list[DispatchRun] = []
    for _ in range(dispatch_runs):  # alternating, so both see the same minutes of a noisy machine
        idle.append(dispatch_samples(samples))
        loaded.append(dispatch_samples(samples, busy=True))
    recovery = recovery_samples(kills, LEASE_TTL)
    # At smoke sizes only the first concurrency: a round there is mostly worker start-up.
    scaled = {c: scaling_rounds(runs, rounds, concurrency=c) for c in (concurrencies[:1] if smoke else concurrencies)}
    none = ("-",) * (len(concurrencies) - 1)

    def ratio(c: int) -> str:
        if c not in scaled:
            return "-"
        one, two = (common.median([r.steps_per_s for r in rs]) for rs in scaled[c])
        return f"{one:.0f} -> {two:.0f} ({two / one:.2f}x)"

    def pooled(dispatch: list[DispatchRun]) -> str:
        return f"{_p([d.total for r in dispatch for d in r.samples], 1000, '.1f')} ms"

    rows = [
        (f"dispatch latency, start() to first step, p50 / p95, idle worker ({dispatch_runs}x{samples} runs)",
         pooled(idle), *none, "p95 < 10 ms in each run"),
        (f"dispatch beside one busy worker, start() to first step, p50 / p95 ({dispatch_runs}x{samples} runs)",
         pooled(loaded), *none, "-"),
        (f"recovery after SIGKILL, p50 / p95 ({kills} kills, lease TTL {LEASE_TTL:g} s, sweep {SWEEP_INTERVAL:g} s)",
         f"{_p([r.total for r in recovery], 1, '.2f')} s", *none,
         f"<= {LEASE_TTL + 2:g} s (TTL + 2 s)"),
        (f"pure steps/s, 1 worker process -> 2 ({runs}x{PURE_STEPS} steps, median of {rounds})",
         *(ratio(c) for c in concurrencies), ">= 1.7x"),
    ]
    notes = [
        "dispatch p95 per run, ms: idle " + ", ".join(f"{r.p95_ms:.1f}" for r in idle)
        + "; beside a busy worker " + ", ".join(f"{r.p95_ms:.1f}" for r in loaded)
        + " (the busy worker meanwhile: " + ", ".join(f"{r.busy_steps_per_s:.0f}" for r in loaded) + " steps/s)",
        "dispatch p50 / p95, ms, idle: " + _breakdown(idle),
        "dispatch p50 / p95, ms, beside a busy worker: " + _breakdown(loaded),
        "recovery per kill, SIGKILL to the next step on another worker, s (lease left + sweep and dispatch): "
        + ", ".join(f"{r.total:.2f} ({r.lease_left:.2f}+{r.total - r.lease_left:.2f})" for r in recovery),
    ]
    for c in scaled:
        one, two = scaled[c]
        notes.append(f"concurrency {c}, 2 workers / 1 per round: "
                     + ", ".join(f"{b.steps_per_s / a.steps_per_s:.2f}" for a, b in zip(one, two)))
        for label, rs in zip(("1 worker ", "2 workers"), scaled[c]):
            notes.append(
                f"concurrency {c}, {label}: steps/s " + ", ".join(f"{r.steps_per_s:.0f}" for r in rs)
                + "; CPU ms per step (worker, its PG backends, redis-server) "
                + ", ".join(f"{r.cpu.worker_ms:.2f}+{r.cpu.backend_ms:.2f}+{r.cpu.redis_ms:.2f}" for r in rs)
                + "; machine busy " + ", ".join(f"{r.cpu.busy:.0%}" for r in rs)
            )
    return Extra(rows, notes, idle, loaded, scaled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--feed", type=int, metavar="BACKLOG", help=argparse.SUPPRESS)  # the busy worker's feeder
    args = parser.parse_args()
    common.setup_django()
    if args.feed:
        feed(args.feed)
        return
    extra = measure(smoke=args.smoke)
    common.print_table("Engine, more figures (worker processes at the given concurrency)",
                       [("figure", "concurrency 1", "concurrency 4", "target"), *extra.rows])
    for line in extra.notes:
        print(line)


if __name__ == "__main__":
    main()

"""Dispatch latency, recovery after SIGKILL, and scaling from one worker process to two.

    .venv/bin/python bench/engine_extra.py            # full sizes: about 7 minutes on a quiet machine
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

from bench import common  # noqa: E402

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

    def spawn(self, *args: str) -> subprocess.Popen:
        proc = common.spawn_worker(*args, env=self.env)
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

    from sagas.queue import redis_connection

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


def dispatch_samples(samples: int) -> list[Dispatch]:
    """One idle, warmed-up worker at concurrency 1, sweeping every 2 s as in production.
    Runs go one at a time, each after a random pause of 50 to 250 ms, so the worker is
    blocked in its dequeue when the wake-up arrives, not working off a backlog."""
    from sagas import start
    from sagas.models import JournalEntry, WorkflowRun

    common.reset_state()
    results: list[Dispatch] = []
    with Workers(common.bench_env()) as workers:
        _wait_listening(workers.spawn())
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
    return results


def dispatch_latency(samples: int) -> list[float]:
    """Seconds from just before ``start()`` to the first step executing, one per sample."""
    return [d.total for d in dispatch_samples(samples)]


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
class ScalingRound:
    """A round's throughput and, over the same window, CPU per step by process group."""

    steps_per_s: float
    worker_ms: float  # the worker processes
    backend_ms: float  # their PostgreSQL backends (fdatasync included)
    redis_ms: float  # the whole Redis server, shared with whatever else uses it
    busy: float  # share of the machine's CPUs busy, other people's work included


def _scaling_round(runs: int, processes: int, concurrency: int) -> ScalingRound:
    """Steps/s of ``bench_pure20`` runs, from the journal's first claim to its last
    completion, as in ``bench/engine.py``. The workers (``--no-sweep``) listen before the
    runs exist, so each takes work from the first claim; the runs are created in one
    transaction, and their wake-ups go out as it commits. ``/proc`` is sampled every
    0.1 s meanwhile, to show where the CPU goes."""
    from django.db import connection, transaction

    from sagas import start
    from sagas.models import WorkflowRun
    from sagas.queue import redis_connection

    common.reset_state()
    redis_pid = int(redis_connection().info("server")["process_id"])
    last: dict[tuple[str, int], int] = {}  # (group, pid) -> latest ticks seen
    samples: list[tuple[float, dict[str, int], tuple[int, int]]] = []
    deadline = time.monotonic() + 600
    with Workers(common.bench_env()) as workers:
        procs = [workers.spawn("--no-sweep", "--concurrency", str(concurrency)) for _ in range(processes)]
        for proc in procs:
            _wait_listening(proc)
        with transaction.atomic():
            for _ in range(runs):
                start("bench_pure20", {})
        while WorkflowRun.objects.filter(status="COMPLETED").count() < runs:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{processes} worker(s) did not complete {runs} runs")
            with connection.cursor() as cur:
                cur.execute("""SELECT pid FROM pg_stat_activity WHERE datname = current_database()
                                  AND backend_type = 'client backend' AND pid <> pg_backend_pid()""")
                backends = [pid for (pid,) in cur.fetchall()]
            groups = {"worker": [p.pid for p in procs], "backend": backends, "redis": [redis_pid]}
            samples.append((time.time(), _cpu(groups, last), _machine()))
            time.sleep(0.1)
    with connection.cursor() as cur:
        cur.execute("""SELECT count(DISTINCT split_part(worker_id, '/', 1)) FILTER (WHERE kind = 'claimed'),
                              min(created_at) FILTER (WHERE kind = 'claimed'),
                              max(created_at) FILTER (WHERE kind = 'completed')
                         FROM sagas_journalentry WHERE kind IN ('claimed', 'completed')""")
        claimers, first, last_done = cur.fetchone()
    if claimers != processes:
        raise RuntimeError(f"runs were claimed by {claimers} worker processes, not {processes}")
    steps_per_s = runs * PURE_STEPS / (last_done - first).total_seconds()
    inside = [s for s in samples if first.timestamp() <= s[0] <= last_done.timestamp()]
    if len(inside) < 2:  # a round too short to sample (smoke sizes)
        return ScalingRound(steps_per_s, *(float("nan"),) * 4)
    (t_a, cpu_a, (busy_a, all_a)), (t_b, cpu_b, (busy_b, all_b)) = inside[0], inside[-1]
    steps = steps_per_s * (t_b - t_a)

    def ms(group: str) -> float:
        return 1000 * (cpu_b[group] - cpu_a[group]) / CLK_TCK / steps

    busy = (busy_b - busy_a) / (all_b - all_a)
    return ScalingRound(steps_per_s, ms("worker"), ms("backend"), ms("redis"), busy)


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


def measure(*, smoke: bool, concurrencies: tuple[int, ...] = (1, 4)) -> tuple[list[tuple[str, ...]], list[str]]:
    """Table rows (figure, one cell per concurrency, target) and the lines to print under it."""
    samples, kills, runs, rounds = (5, 2, 10, 1) if smoke else (100, 20, 250, 5)
    dispatch = dispatch_samples(samples)
    recovery = recovery_samples(kills, LEASE_TTL)
    scaled = {c: scaling_rounds(runs, rounds, concurrency=c) for c in concurrencies}
    none = ("-",) * (len(concurrencies) - 1)

    def ratio(c: int) -> str:
        one, two = (common.median([r.steps_per_s for r in rs]) for rs in scaled[c])
        return f"{one:.0f} -> {two:.0f} ({two / one:.2f}x)"

    rows = [
        (f"dispatch latency, start() to first step, p50 / p95 ({samples} runs)",
         f"{_p([d.total for d in dispatch], 1000, '.1f')} ms", *none, "p95 < 25 ms"),
        (f"recovery after SIGKILL, p50 / p95 ({kills} kills, lease TTL {LEASE_TTL:g} s, sweep {SWEEP_INTERVAL:g} s)",
         f"{_p([r.total for r in recovery], 1, '.2f')} s", *none,
         f"<= {LEASE_TTL + 2:g} s (TTL + 2 s)"),
        (f"pure steps/s, 1 worker process -> 2 ({runs}x{PURE_STEPS} steps, median of {rounds})",
         *(ratio(c) for c in concurrencies), ">= 1.7x"),
    ]
    notes = [
        "dispatch p50 / p95, ms: start() " + _p([d.start_call for d in dispatch], 1000, ".1f")
        + "; to claim (RQ wake-up, job preamble) " + _p([d.to_claim for d in dispatch], 1000, ".1f")
        + "; claim to first step " + _p([d.to_step for d in dispatch], 1000, ".1f"),
        "recovery per kill, SIGKILL to the next step on another worker, s (lease left + sweep and dispatch): "
        + ", ".join(f"{r.total:.2f} ({r.lease_left:.2f}+{r.total - r.lease_left:.2f})" for r in recovery),
    ]
    for c in concurrencies:
        one, two = scaled[c]
        notes.append(f"concurrency {c}, 2 workers / 1 per round: "
                     + ", ".join(f"{b.steps_per_s / a.steps_per_s:.2f}" for a, b in zip(one, two)))
        for label, rs in zip(("1 worker ", "2 workers"), scaled[c]):
            notes.append(
                f"concurrency {c}, {label}: steps/s " + ", ".join(f"{r.steps_per_s:.0f}" for r in rs)
                + "; CPU ms per step (worker, its PG backends, redis-server) "
                + ", ".join(f"{r.worker_ms:.2f}+{r.backend_ms:.2f}+{r.redis_ms:.2f}" for r in rs)
                + "; machine busy " + ", ".join(f"{r.busy:.0%}" for r in rs)
            )
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args()
    common.setup_django()
    rows, notes = measure(smoke=args.smoke)
    common.print_table("Engine, more figures (worker processes at the given concurrency)",
                       [("figure", "concurrency 1", "concurrency 4", "target"), *rows])
    for line in notes:
        print(line)


if __name__ == "__main__":
    main()

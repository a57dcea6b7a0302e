"""A fan-out of child runs and a gather, on real workers: how long, how many commits per child,
and what the wait costs the parent in claims and replays.

    .venv/bin/python bench/children.py            # 1,000 children, 2 workers, 3 repeats (about 3 minutes)
    .venv/bin/python bench/children.py --smoke    # 20 children, 1 repeat (run by the test suite)

One parent run (``bench_fan_out``, ``bench/children_workflows.py``) starts ``--children``
children ``bench_child`` (one trivial ``ctx.step`` each) one after another with
``ctx.start_child``, then ``ctx.gather``s them all: it is meant to go WAITING holding no worker,
and each child's end journals ``child_finished`` on it; the last one wakes it (whether it did is
in the table: its WAITING spells, its executions, how long it held a worker). The baseline is the same number of
plain top-level runs of ``bench_child`` started directly with ``sagas.start()``. Each repeat
runs the fan-out, then the baseline, each on ``--workers`` fresh ``sagas_worker`` processes
(default 2, one per core of the machine the figures come from; concurrency 1, the sweeper on,
as deployed), stopped by process group at the end of the round. Figures per round:

* time: the parent's ``created_at`` (``start()``) to its ``finished_at``; for the baseline,
  the first run's ``created_at`` to the last one's ``finished_at``;
* commits: ``pg_stat_database.xact_commit`` of the bench database over the round, divided by
  the children (runs). The round starts ``--settle`` seconds after the workers are ready (an
  idle backend reports its statistics up to 10 s late: their start-up is not counted) and ends
  after they exited (an exiting backend reports). This process's own polling statements are
  counted and subtracted. The workers' heartbeats and sweeps commit too, busy or not: a round
  with no run measures that (commits per second of idle workers), and the "less idle" rows
  subtract it over the round's length;
* the parent: its claims (``attempts``), how many times a worker executed its function (each
  claim's first execution and every replay within it: a Redis counter the workflow bumps),
  its WAITING spells (``suspended`` entries), its journal's length (``last_seq``), the fan-out
  (its first claim to its last ``child_started``), the gather's tail (the last child's
  ``finished_at`` to the parent's), and each wake-up (the last entry between a ``suspended`` and
  the claim that followed it: what woke it) to that claim: over ``SLOW_WAKE`` is a lost wake-up found by the sweeper.

Table: min / median / max over the repeats (ratios are taken round by round). Its own database
(``saga_bench_children``; ``saga_bench_children_smoke`` with ``--smoke``) on the shared
PostgreSQL, and a private ``redis-server`` (``bench/servers.py``: every database of the shared
Redis is taken). Exit 1 when a round did not finish (``--timeout``) or a run did not complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.servers import RedisServer

SIZES = {
    "full": dict(children=1000, repeats=3, settle=11.0, idle=20.0, db="saga_bench_children"),
    "smoke": dict(children=20, repeats=1, settle=0.5, idle=1.0, db="saga_bench_children_smoke"),
}
MODULES = "bench.children_workflows"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "COMPENSATED", "NEEDS_ATTENTION")
SLOW_WAKE = 1.0  # seconds from a wake-up to the claim: more is not the queue's speed but a lost wake-up
POLL = 0.1  # seconds between this process's looks at the runs (each one statement, counted)


class Workers:
    """``sagas_worker`` processes, each in its own process group, logging to a file."""

    def __init__(self, count: int, concurrency: int, env: dict[str, str], log_dir: Path, label: str) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs = [log_dir / f"{label}-w{i}.log" for i in range(1, count + 1)]
        self.ready = [log_dir / f"{label}-w{i}.ready" for i in range(1, count + 1)]
        for i, (log_path, ready) in enumerate(zip(self.logs, self.ready), start=1):
            with open(log_path, "wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "manage.py", "sagas_worker", "--name", f"{label}-w{i}", "--concurrency",
                     str(concurrency), "--ready-file", str(ready)],
                    cwd=common.ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))

    def wait_ready(self, timeout: float = 90) -> None:
        if not common.wait_for(lambda: all(r.exists() for r in self.ready) or self.dead(), timeout) or self.dead():
            raise SystemExit(f"the workers did not start: {self.dead() or 'not ready'}; {self.tail()}")

    def dead(self) -> list[str]:
        return [f"w{i} exited {p.returncode}" for i, p in enumerate(self.procs, 1) if p.poll() is not None]

    def tail(self, chars: int = 2000) -> str:
        return " ".join(f"[{p.name}] {p.read_text(errors='replace')[-chars:]}" for p in self.logs if p.exists())

    def stop(self) -> None:
        """SIGTERM to each process group, SIGKILL to those still there 30 s later."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
        self.procs = []


class Meter:
    """This database's commit counter around a round; counts this process's own statements."""

    def __init__(self) -> None:
        self.own = 0

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(sql, params or [])
            rows = cur.fetchall()
        self.own += 1  # autocommit: one statement, one commit
        return rows

    def commits(self) -> int:
        self.query("SELECT pg_stat_clear_snapshot()")
        return self.query("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]


@dataclass
class Round:
    seconds: float
    commits: int  # this process's polling statements already subtracted
    window: float  # seconds from the first commit reading to the last
    parent: dict | None = None


def one_round(kind: str, size: dict, args: argparse.Namespace, env: dict[str, str], log_dir: Path,
              label: str) -> Round:
    """``kind`` "fan_out" (one parent, ``children`` children), "plain" (as many top-level runs)
    or "idle" (no run: ``size['idle']`` seconds of idle workers)."""
    from sagas import start

    n = size["children"]
    common.reset_state()
    workers = Workers(args.workers, args.concurrency, env, log_dir, label)
    meter = Meter()
    try:
        workers.wait_ready()
        time.sleep(size["settle"])
        before = meter.commits()
        own_before = meter.own
        began = time.monotonic()
        if kind == "idle":
            time.sleep(size["idle"])
        else:
            # The start() calls are the runs' own cost: their commits are counted.
            if kind == "fan_out":
                ids = [str(start("bench_fan_out", {"n": n}).id)]
                sql, params, expected = "SELECT count(*) FROM sagas_workflowrun WHERE id = %s AND status = ANY(%s)", [ids[0]], 1
            else:
                ids = [str(start("bench_child", {"i": i}).id) for i in range(n)]
                sql, params, expected = "SELECT count(*) FROM sagas_workflowrun WHERE status = ANY(%s)", [], n
            deadline = time.monotonic() + args.timeout
            while True:
                (ended,), = meter.query(sql, [*params, list(TERMINAL)])  # one statement a look
                if ended >= expected:
                    break
                if workers.dead() or time.monotonic() > deadline:
                    stuck = meter.query("SELECT workflow_name, status, count(*) FROM sagas_workflowrun GROUP BY 1, 2")
                    raise SystemExit(f"{label}: not finished after {time.monotonic() - began:.0f} s (--timeout "
                                     f"{args.timeout:g}), workers {workers.dead() or 'alive'}, runs {stuck}; "
                                     f"{workers.tail()}")
                time.sleep(POLL)
    finally:
        workers.stop()
    time.sleep(1.5)  # exited backends' statistics reach pg_stat_database
    after = meter.commits()
    window = time.monotonic() - began
    # The difference holds this process's statements from the first reading's last (its
    # SELECT) to the second reading's first (the snapshot clear): as many as it made since.
    commits = after - before - (meter.own - own_before)
    if kind == "idle":
        return Round(0.0, commits, window)
    return check_and_measure(kind, ids, n, commits, window)


def check_and_measure(kind: str, ids: list[str], n: int, commits: int, window: float) -> Round:
    from django.db.models import Max, Min

    from bench.children_workflows import EXECUTIONS_KEY
    from sagas.models import JournalEntry, WorkflowRun
    from sagas.runtime.queue import redis_connection

    runs = WorkflowRun.objects.filter(workflow_name="bench_child")
    not_completed = runs.exclude(status="COMPLETED").count()
    if runs.count() != n or not_completed:
        raise SystemExit(f"{kind}: {runs.count()} bench_child runs (expected {n}), {not_completed} not COMPLETED")
    if kind == "plain":
        span = runs.aggregate(a=Min("created_at"), b=Max("finished_at"))
        return Round((span["b"] - span["a"]).total_seconds(), commits, window)
    parent = WorkflowRun.objects.get(id=ids[0])
    if parent.status != "COMPLETED" or parent.result != {"children": n, "sum": n * (n - 1)}:
        raise SystemExit(f"the parent ended {parent.status} ({parent.status_reason}): {parent.result or parent.error}")
    if runs.exclude(parent_run=parent.id).exists():
        raise SystemExit("a bench_child run is not the parent's child")
    journal = JournalEntry.objects.filter(run_id=parent.id)
    kinds = {k: journal.filter(kind=k).count() for k in ("claimed", "suspended", "child_started", "child_finished")}
    first_claim = journal.filter(kind="claimed").aggregate(t=Min("created_at"))["t"]
    last_started = journal.filter(kind="child_started").aggregate(t=Max("created_at"))["t"]
    last_child = runs.aggregate(t=Max("finished_at"))["t"]
    executions = int(redis_connection().get(EXECUTIONS_KEY.format(run_id=parent.id)) or 0)
    # Each WAITING spell: the entry that woke it to the next claim. A gather of every child in flight
    # is woken by the last child's end only (the others are journaled while it sleeps on), so the
    # entry that woke it is the last one before the claim.
    # Its claims: each from its ``claimed`` entry to the entry that gave the worker back.
    wakes, waking, held, claimed_at = [], None, 0.0, None
    for kind, at in journal.order_by("seq").values_list("kind", "created_at"):
        if kind == "suspended":
            waking = "asleep"
        elif waking is not None and kind != "claimed":
            waking = at
        if kind == "claimed":
            claimed_at = at
            if waking is not None and waking != "asleep":
                wakes.append((at - waking).total_seconds())
            waking = None
        elif kind in ("suspended", "completed", "failed", "yielded", "halted") and claimed_at is not None:
            held += (at - claimed_at).total_seconds()
            claimed_at = None
    return Round((parent.finished_at - parent.created_at).total_seconds(), commits, window, parent={
        "attempts": parent.attempts, "executions": executions, "suspended": kinds["suspended"],
        "claimed_entries": kinds["claimed"], "last_seq": parent.last_seq, "entries": journal.count(),
        "child_started": kinds["child_started"], "child_finished": kinds["child_finished"],
        "fan_out_s": (last_started - first_claim).total_seconds(),
        "tail_s": (parent.finished_at - last_child).total_seconds(),
        "completed": True, "held_s": held, "drain_s": (last_child - last_started).total_seconds(),
        "wake_median_s": common.median(wakes) if wakes else None, "wake_max_s": max(wakes, default=None),
        "slow_wakes": sum(1 for w in wakes if w > SLOW_WAKE),
    })


def spread(values: list[float | None], fmt: str) -> tuple[str, str, str]:
    """min, median, max of the values measured (None: not in that round, e.g. no wake-up)."""
    values = [v for v in values if v is not None]
    if not values:
        return ("-", "-", "-")
    return (format(min(values), fmt), format(common.median(values), fmt), format(max(values), fmt))


def table(size: dict, args: argparse.Namespace, fan: list[Round], plain: list[Round], idle: Round) -> list[tuple]:
    n = size["children"]
    idle_rate = idle.commits / idle.window

    def net(r: Round) -> float:
        return (r.commits - idle_rate * r.window) / n

    p = [r.parent for r in fan]
    completed = f"{sum(1 for x in p if x['completed'])} of {len(p)}"  # a round that did not raises first
    rows: list[tuple] = [
        ("figure", "min", "median", "max"),
        (f"rounds whose parent COMPLETED with its {n:,} children's results", completed, completed, completed),
        (f"fan-out of {n:,} children + gather: parent start() to COMPLETED, s", *spread([r.seconds for r in fan], ".2f")),
        (f"{n:,} plain runs: first start() to last COMPLETED, s", *spread([r.seconds for r in plain], ".2f")),
        ("fan-out time / plain time", *spread([f.seconds / b.seconds for f, b in zip(fan, plain)], ".2f")),
        ("fan-out: ms per child", *spread([r.seconds * 1000 / n for r in fan], ".2f")),
        ("plain: ms per run", *spread([r.seconds * 1000 / n for r in plain], ".2f")),
        ("commits per child (whole round)", *spread([r.commits / n for r in fan], ".2f")),
        ("commits per plain run (whole round)", *spread([r.commits / n for r in plain], ".2f")),
        ("commits per child, less idle workers'", *spread([net(r) for r in fan], ".2f")),
        ("commits per plain run, less idle workers'", *spread([net(r) for r in plain], ".2f")),
        ("commits a child costs beyond a plain run (less idle)",
         *spread([net(f) - net(b) for f, b in zip(fan, plain)], ".2f")),
        ("parent claims (attempts)", *spread([x["attempts"] for x in p], ".0f")),
        ("parent function executions (first + replays, all claims)", *spread([x["executions"] for x in p], ".0f")),
        ("parent WAITING spells (suspended entries)", *spread([x["suspended"] for x in p], ".0f")),
        ("parent journal entries (last_seq)", *spread([x["last_seq"] for x in p], ".0f")),
        ("parent entries replayed in all (executions x journal, upper bound)",
         *spread([x["executions"] * x["last_seq"] for x in p], ",.0f")),
        ("parent held a worker (its claims, claimed to suspended or completed), s",
         *spread([x["held_s"] for x in p], ".2f")),
        ("parent wake-up (last entry before the claim) to the claim, median, s",
         *spread([x["wake_median_s"] for x in p], ".3f")),
        ("parent wake-up to its next claim, longest, s", *spread([x["wake_max_s"] for x in p], ".2f")),
        (f"parent wake-ups claimed more than {SLOW_WAKE:g} s later (lost; the sweeper's orphan pass)",
         *spread([x["slow_wakes"] for x in p], ".0f")),
        ("parent fan-out: first claim to last child_started, s", *spread([x["fan_out_s"] for x in p], ".2f")),
        ("children after the fan-out: last child_started to last child finished, s",
         *spread([x["drain_s"] for x in p], ".2f")),
        ("gather tail: last child finished to parent COMPLETED, s", *spread([x["tail_s"] for x in p], ".3f")),
        ("idle workers: commits per second (one round, no run)", f"{idle_rate:.1f}", f"{idle_rate:.1f}",
         f"{idle_rate:.1f}"),
    ]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="20 children, 1 repeat (the test suite runs this)")
    parser.add_argument("--children", type=int, default=None, help="children of the parent (default 1,000; smoke 20)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of each kind (default 3; smoke 1)")
    parser.add_argument("--workers", type=int, default=2, help="sagas_worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=1, help="threads per worker (default 1)")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds between the workers' readiness and the first commit reading (default 11; smoke 1.2)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a round may take before the bench gives up (default 120 + 0.5 per child)")
    args = parser.parse_args()
    size = dict(SIZES["smoke" if args.smoke else "full"])
    if args.children:
        size["children"] = args.children
    if args.repeats:
        size["repeats"] = args.repeats
    if args.settle is not None:
        size["settle"] = args.settle
    args.timeout = args.timeout or 120 + 0.5 * size["children"]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-children-"))
    redis = RedisServer()
    ok = False
    try:
        redis.start()
        common.BENCH_DB = common.BENCH_DB.rsplit("/", 1)[0] + "/" + size["db"]
        common.BENCH_REDIS = redis.url(0)
        common.setup_django(SAGAS_MODULES=MODULES)
        env = common.bench_env(SAGAS_MODULES=MODULES)
        print(f"{time.strftime('%H:%M:%S')} bench/children.py: database {size['db']}, private Redis :{redis.port}, "
              f"{args.workers} workers x {args.concurrency}, logs {log_dir}", file=sys.stderr, flush=True)
        load_before = os.getloadavg()
        idle = one_round("idle", size, args, env, log_dir, "idle")
        fan, plain = [], []
        for r in range(1, size["repeats"] + 1):
            fan.append(one_round("fan_out", size, args, env, log_dir, f"fan{r}"))
            plain.append(one_round("plain", size, args, env, log_dir, f"plain{r}"))
            print(f"{time.strftime('%H:%M:%S')} round {r}: fan-out {fan[-1].seconds:.2f} s, "
                  f"plain {plain[-1].seconds:.2f} s, parent {fan[-1].parent}", file=sys.stderr, flush=True)
        load = os.getloadavg()
        common.print_table(
            f"Child runs: one parent fans out {size['children']:,} children (one step each) and gathers them, "
            f"against {size['children']:,} plain runs; {args.workers} worker processes x {args.concurrency}, "
            f"{size['repeats']} repeats (load average before {load_before[0]:.2f}, after {load[0]:.2f})",
            table(size, args, fan, plain, idle),
        )
        ok = True
    except BaseException:  # noqa: BLE001  (SystemExit included: report, clean up, exit 1)
        traceback.print_exc()
    finally:
        try:
            redis.cleanup()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if ok:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        print(f"worker logs kept: {log_dir}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Engine throughput, commit cost, replay, dispatch, recovery and scaling, beside DBOS Transact
and ``pgbench``, and the table of the engine's targets (``print_targets``).

    .venv/bin/python bench/engine.py              # full sizes: 19 minutes at load 4-7 on 2 cores
    .venv/bin/python bench/engine.py --no-dbos    # the same without DBOS's rounds
    .venv/bin/python bench/engine.py --smoke      # tiny sizes (run by the test suite)

Prints two tables, the engine's figures and its targets. Figures:

* the cost of a durable commit on this PostgreSQL at this minute: ``pgbench`` with one
  client INSERTing one row into a table of its own in the bench database
  (``pgbench -n -c1 -T 3``), just before and just after each concurrency-1 round of ours
  (their mean time per commit), so the ratio of our steps/s to its commits/s compares the
  same minutes of a noisy machine;
* pure-step throughput of one worker process (``sagas_worker --burst``) at
  concurrency 1 and 4: 20-step workflows back to back, timed from the journal
  (first claim to last completion, so process start-up is excluded). Rounds of
  the two concurrencies alternate, and each figure is the median of its rounds;
* PostgreSQL commits per pure step: ``pg_stat_database.xact_commit`` over the
  worker's whole life, start-up included, divided by the steps. Over 20-step
  runs this includes each run's claim, journal load (a read-only transaction,
  which PostgreSQL counts as a commit too) and finish; over one 10,000-step run
  it is what a step costs on its own;
* where the time of a run goes at each concurrency, from the journal's
  timestamps (median over runs): claim to completion, and the gap between one
  thread's consecutive runs (finish commit, RQ bookkeeping, dequeue);
* the time to load and replay a 10,000-entry journal (median of 5);
* DBOS Transact 3.4 on the same 20-step shape, against the same PostgreSQL, in
  its own virtualenv (``bench/dbos.py``): one DBOS round after each of ours,
  and the ratio of ours to theirs per worker process;
* dispatch latency, five runs of 100 samples with an idle worker, alternating with five
  beside a second worker process that drains pure-step runs; recovery after SIGKILL;
  scaling from one worker process to two, with CPU per step by process from ``/proc``
  (``bench/engine_extra.py``);
* the 100,000-turn ``continue_as_new`` loop of ``bench/continue_loop.py``: per-turn
  latency of its first and last 1,000 turns.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, dbos, engine_extra

STEPS_PER_RUN = 20
PGBENCH_TABLE = "bench_pgbench_insert"  # pgbench's own, in the bench database
PGBENCH_SCRIPT = f"INSERT INTO {PGBENCH_TABLE} (payload) VALUES ('{{\"value\": 42}}');\n"
LOOP_TURNS, LOOP_EVERY = 100_000, 200  # the continue_as_new loop whose per-turn time must stay flat
FLAT = 1.2  # the loop counts as flat when its last 1,000 turns' median is within 20 % of its first's


@dataclass(frozen=True)
class Pgbench:
    tps: float  # one client's committed one-row INSERTs per second
    latency_ms: float


def _pgbench_binary() -> str:
    found = shutil.which("pgbench") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)),
                                             None)
    if not found:
        raise SystemExit("pgbench is neither on PATH nor in /usr/lib/postgresql/*/bin")
    return found


def pgbench_commits(seconds: int) -> Pgbench:
    """One client committing a one-row INSERT for ``seconds`` on the bench database
    (``pgbench -n -c1 -j1 -T seconds -f one_insert.sql``), into a table of its own,
    emptied afterwards."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"""CREATE TABLE IF NOT EXISTS {PGBENCH_TABLE}
                        (id bigserial PRIMARY KEY, payload jsonb, created_at timestamptz DEFAULT now())""")
    params = connection.get_connection_params()
    env = dict(os.environ, PGPASSWORD=str(params.get("password") or ""))
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="bench-pgbench-") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        done = subprocess.run(
            [_pgbench_binary(), "-n", "-c1", "-j1", "-T", str(seconds), "-f", script.name,
             "-h", str(params.get("host") or "127.0.0.1"), "-p", str(params.get("port") or 5432),
             "-U", str(params.get("user") or "postgres"), connection.settings_dict["NAME"]],
            capture_output=True, text=True, env=env, timeout=seconds + 60,
        )
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {PGBENCH_TABLE}")
    tps = re.search(r"tps = ([0-9.]+)", done.stdout)
    latency = re.search(r"latency average = ([0-9.]+) ms", done.stdout)
    if done.returncode != 0 or not tps or not latency:
        raise SystemExit(f"pgbench failed (exit {done.returncode}): {done.stdout[-1000:]}{done.stderr[-1000:]}")
    return Pgbench(float(tps.group(1)), float(latency.group(1)))


def bracketed(before: Pgbench, after: Pgbench) -> Pgbench:
    """The commit rate over a round, from ``pgbench`` just before and just after it: the mean
    time per commit of the two windows. One window alone moved by a factor of two from one
    minute to the next on a slow day (bench/README.md, "A step writes one row")."""
    latency = (before.latency_ms + after.latency_ms) / 2
    return Pgbench(2 / (1 / before.tps + 1 / after.tps), latency)


def xact_commits() -> int:
    """This database's commit counter. Costs two autocommit statements, which the
    next reading counts: callers subtract them."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return cur.fetchone()[0]


@dataclass
class Round:
    steps_per_s: float
    commits_per_step: float
    run_ms: float  # median claim -> completed of one run
    gap_ms: float  # median completed -> next claim on the same worker thread


def throughput_round(runs: int, concurrency: int) -> Round:
    from django.db import connection

    from sagas import start
    from sagas.models import WorkflowRun

    common.reset_state()
    ids = [start("bench_pure20", {}).id for _ in range(runs)]
    time.sleep(1.2)  # the bench's own commits reach the statistics before the baseline
    before = xact_commits()
    worker = common.spawn_worker("--burst", "--no-sweep", "--concurrency", str(concurrency))
    worker.wait(timeout=600)
    time.sleep(1.5)  # backends flush their statistics when they exit
    after = xact_commits()
    done = WorkflowRun.objects.filter(id__in=ids, status="COMPLETED").count()
    if worker.returncode != 0 or done != runs:
        raise SystemExit(
            f"concurrency {concurrency}: {done} of {runs} runs completed, worker exit {worker.returncode}: "
            f"{worker.stderr.read().decode()[-2000:]}"
        )
    with connection.cursor() as cur:
        cur.execute(
            """SELECT run_id, worker_id,
                      min(created_at) FILTER (WHERE kind = 'claimed'),
                      max(created_at) FILTER (WHERE kind = 'completed')
                 FROM sagas_journalentry WHERE kind IN ('claimed', 'completed')
                GROUP BY run_id, worker_id"""
        )
        spans = cur.fetchall()
    if len(spans) != runs:
        raise SystemExit(f"concurrency {concurrency}: a run was claimed more than once; the figures would be wrong")
    first = min(claimed for _, _, claimed, _ in spans)
    last = max(completed for _, _, _, completed in spans)
    by_thread: dict[str, list[tuple]] = {}
    for _, worker_id, claimed, completed in spans:
        by_thread.setdefault(worker_id, []).append((claimed, completed))
    gaps = [
        (b[0] - a[1]).total_seconds()
        for seq in by_thread.values()
        for a, b in zip(sorted(seq), sorted(seq)[1:])
    ]
    steps = runs * STEPS_PER_RUN
    return Round(
        steps_per_s=steps / (last - first).total_seconds(),
        commits_per_step=(after - before - 2) / steps,
        run_ms=1000 * statistics.median((c - s).total_seconds() for _, _, s, c in spans),
        gap_ms=1000 * statistics.median(gaps) if gaps else float("nan"),
    )


def long_run(entries: int) -> tuple[str, float]:
    """Advance one ``entries``-step run in this process; returns its id and commits per step.

    The connection is closed before and after, so every commit of the run (claim,
    journal load, steps, lease renewals, finish) is in the statistics when read.
    """
    from django.db import connection

    from sagas import start
    from sagas.models import WorkflowRun
    from sagas.replay.engine import advance

    common.reset_state()
    run = start("bench_long", {"steps": entries})
    time.sleep(1.2)
    before = xact_commits()
    connection.close()
    outcome = advance(str(run.id), owner="bench")
    connection.close()
    time.sleep(1.5)
    after = xact_commits()
    status = WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)
    if status != "COMPLETED":
        raise SystemExit(f"the {entries}-step run ended {outcome.value} ({status})")
    return str(run.id), (after - before - 2) / entries


def replay_time(run_id: str, rounds: int) -> float:
    from sagas.models import WorkflowRun
    from sagas.replay.context import Context
    from sagas.store import systemdb
    from sagas.versions import registry

    run = WorkflowRun.objects.get(id=run_id)
    definition = registry.get("bench_long", 1)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        journal = systemdb.load_journal(str(run.id))
        claimed = systemdb.ClaimedRun(
            id=str(run.id), workflow_name=run.workflow_name, version=run.version,
            definition_hash=run.definition_hash, input=run.input, tenant=run.tenant,
            business_key=run.business_key, fence=run.fence, attempts=run.attempts,
            steps_used=run.steps_used, cost_used=run.cost_used, max_steps=None, max_cost=None,
            max_duration_seconds=None, started_at=run.started_at,
        )
        ctx = Context(run=claimed, journal=journal, worker_id="bench")
        result = definition.fn(ctx, run.input)
        ctx.check_finished()
        times.append(time.perf_counter() - t0)
        assert result == run.result
    assert WorkflowRun.objects.get(id=run.id).last_seq == run.last_seq  # replay wrote nothing
    return statistics.median(times)


def continue_loop(turns: int, every: int) -> dict | str:
    """``bench.continue_loop.measure(turns, every)``: helper "continue"'s bench, which runs
    in a child process on its own database (``saga_bench_loop``) and Redis db 12; its
    figures, or why there are none (a checkout from before continue_as_new)."""
    if not (common.ROOT / "bench" / "continue_loop.py").exists():
        return "not measured: bench/continue_loop.py is not in this checkout"
    from bench import continue_loop as loop_bench

    return loop_bench.measure(turns=turns, every=every)


def _pct(value: float) -> str:
    return f"{value:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--no-dbos", action="store_true", help="leave out DBOS Transact's rounds")
    parser.add_argument("--loop-turns", type=int, default=None,
                        help=f"turns of the continue_as_new loop (default {LOOP_TURNS:,}; 0 leaves it out)")
    args = parser.parse_args()
    common.setup_django()
    runs, rounds, entries, dbos_runs, pg_seconds = (10, 1, 200, 3, 1) if args.smoke else (250, 5, 10_000, 100, 3)
    loop_turns = args.loop_turns if args.loop_turns is not None else (2 * LOOP_EVERY if args.smoke else LOOP_TURNS)
    concurrencies = (1, 4)
    began = time.monotonic()
    phases: list[str] = []

    def phase(name: str, since: float) -> float:
        now = time.monotonic()
        phases.append(f"{name} {now - since:.0f} s")
        return now

    results: dict[int, list[Round]] = {c: [] for c in concurrencies}
    commit_rates: list[Pgbench] = []
    windows: list[tuple[Pgbench, Pgbench]] = []  # each round's pgbench before and after
    theirs: list[dict] = []
    # The test suite runs the smoke run and installs nothing: without the DBOS virtualenv
    # (`make bench-env`) the smoke run leaves DBOS's rounds out and its table says so.
    dbos_left_out = dbos.absent_reason() if args.smoke and not args.no_dbos and not dbos.venv_ready() else ""
    mark = began
    for _ in range(rounds):
        for c in concurrencies:
            if c == concurrencies[0]:  # the commit rate of the very minutes of the ratio's round
                before = pgbench_commits(pg_seconds)
                results[c].append(throughput_round(runs, c))
                windows.append((before, pgbench_commits(pg_seconds)))
                commit_rates.append(bracketed(*windows[-1]))
            else:
                results[c].append(throughput_round(runs, c))
        if not args.no_dbos and not dbos_left_out:
            theirs.append(dbos.measure(dbos_runs, 1))  # interleaved, so both see the same minutes of a noisy machine
    mark = phase("throughput rounds" + ("" if args.no_dbos or dbos_left_out else " with DBOS"), mark)
    run_id, commits_long = long_run(entries)
    replay = replay_time(run_id, 1 if args.smoke else 5)
    mark = phase("long run and replay", mark)
    extra = engine_extra.measure(smoke=args.smoke, concurrencies=concurrencies)
    mark = phase("dispatch, recovery, scaling", mark)
    loop = continue_loop(loop_turns, LOOP_EVERY) if loop_turns else "not measured: --loop-turns 0"
    mark = phase("continue_as_new loop", mark)

    def med(c: int, field: str, fmt: str) -> str:
        return fmt.format(statistics.median(getattr(r, field) for r in results[c]))

    def per_concurrency(field: str, fmt: str) -> tuple[str, ...]:
        return tuple(med(c, field, fmt) for c in concurrencies)

    none = ("-",) * (len(concurrencies) - 1)
    steps = {c: statistics.median(r.steps_per_s for r in results[c]) for c in concurrencies}
    pg_tps = statistics.median(p.tps for p in commit_rates)
    rows = [
        ("figure", *(f"concurrency {c}" for c in concurrencies), "target"),
        ("pure steps per second, one worker process", *per_concurrency("steps_per_s", "{:.0f}"), "> 1000"),
        (f"pgbench, one client, one-row INSERT commits per second (-T {pg_seconds}, before and after each round)",
         f"{pg_tps:.0f} ({statistics.median(p.latency_ms for p in commit_rates):.2f} ms)", *none, "-"),
        ("ours / pgbench commits, per worker process",
         *(_pct(statistics.median(r.steps_per_s / p.tps for r, p in zip(results[c], commit_rates)))
           for c in concurrencies), ">= 40 % at concurrency 1"),
    ]
    if theirs:
        dbos_steps = statistics.median(t["steps_per_s"][0] for t in theirs)
        dbos_commits = statistics.median(t["commits_per_step"] for t in theirs)
        rows += [
            (f"DBOS Transact {theirs[0]['dbos_version']}: pure steps per second, one process, one workflow at a time",
             f"{dbos_steps:.0f}", *none, "-"),
            ("ours / DBOS, per worker process", *(f"{steps[c] / dbos_steps:.2f}x" for c in concurrencies), ">= 2x"),
            ("DBOS commits per pure step (its default configuration)", f"{dbos_commits:.2f}", *none, "-"),
        ]
    elif dbos_left_out:
        rows.append(("DBOS Transact: pure steps per second, ours / DBOS", dbos_left_out, *none, ">= 2x"))
    rows += [
        (f"commits per pure step ({STEPS_PER_RUN}-step runs, with claim, journal load, finish)",
         *per_concurrency("commits_per_step", "{:.3f}"), "1"),
        (f"commits per step of one {entries}-step run", f"{commits_long:.4f}", *none, "1"),
        (f"time of one {STEPS_PER_RUN}-step run, claim to completed", *per_concurrency("run_ms", "{:.1f} ms"), "-"),
        ("gap between a thread's runs (finish, RQ, dequeue)", *per_concurrency("gap_ms", "{:.1f} ms"), "-"),
        (f"replay of a {entries}-entry journal", f"{replay * 1000:.0f} ms", *none, "< 500 ms"),
        *extra.rows,
    ]
    common.print_table(
        f"Engine (one worker process; runs={runs}x{STEPS_PER_RUN} steps, rounds={rounds}, median)", rows
    )
    for c in concurrencies:
        print(f"steps/s per round, concurrency {c}: " + ", ".join(f"{r.steps_per_s:.0f}" for r in results[c]))
    print("pgbench commits/s per round, before / after the round (latency): "
          + ", ".join(f"{a.tps:.0f} / {b.tps:.0f} ({a.latency_ms:.2f} / {b.latency_ms:.2f} ms)" for a, b in windows))
    if theirs:
        print("DBOS steps/s per round: " + ", ".join(f"{t['steps_per_s'][0]:.0f}" for t in theirs))
    for line in extra.notes:
        print(line)
    print_targets(results, commit_rates, extra, loop, loop_turns)
    phase("total", began)
    print("wall time: " + ", ".join(phases))


def print_targets(results: dict[int, list[Round]], commit_rates: list[Pgbench], extra: engine_extra.Extra,
                  loop: dict | str, loop_turns: int) -> None:
    """The engine's targets, each with what this run measured and whether it is met."""

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else ("met" if ok else "NOT met")

    ratio = {c: statistics.median(r.steps_per_s / p.tps for r, p in zip(rs, commit_rates))
             for c, rs in results.items()}
    steps = {c: statistics.median(r.steps_per_s for r in rs) for c, rs in results.items()}
    pg_tps = statistics.median(p.tps for p in commit_rates)
    cpu = {c: (common.median([r.cpu.worker_ms for r in one]), common.median([r.cpu.backend_ms for r in one]))
           for c, (one, _) in extra.scaled.items()}
    idle_p95 = [r.p95_ms for r in extra.idle]
    loaded_p95 = [r.p95_ms for r in extra.loaded]
    rows: list[tuple[str, ...]] = [
        ("engine target", "measured in this run", "target", "met?"),
        ("pure steps/s per worker process, concurrency 1, / pgbench one-client commits/s",
         f"{steps[1]:.0f} / {pg_tps:.0f} = {_pct(ratio[1])} (median of per-round ratios)", ">= 40 %",
         verdict(ratio[1] >= 0.40)),
        ("the same at concurrency 4", f"{steps[4]:.0f} / {pg_tps:.0f} = {_pct(ratio[4])}", "-", "-"),
    ]
    for c, (worker_ms, backend_ms) in cpu.items():
        total = worker_ms + backend_ms
        rows.append((f"CPU per pure step, worker + its PostgreSQL backend, concurrency {c} (/proc, 1 worker rounds)",
                     f"{worker_ms:.2f} + {backend_ms:.2f} = {total:.2f} ms",
                     "<= 0.5 ms" if c == 1 else "-", verdict(total <= 0.5) if c == 1 and total == total else "-"))
    rows += [
        (f"dispatch p95, idle worker, each of {len(idle_p95)} runs of {len(extra.idle[0].samples)}",
         ", ".join(f"{v:.1f}" for v in idle_p95) + " ms", "< 10 ms in each", verdict(max(idle_p95) < 10)),
        ("dispatch p95 beside one busy worker, each run",
         ", ".join(f"{v:.1f}" for v in loaded_p95) + " ms", "printed beside", "-"),
    ]
    if isinstance(loop, dict):
        first, last = loop["first_median_ms"], loop["last_median_ms"]
        rows.append((f"continue_as_new loop, {loop_turns:,} turns, every {LOOP_EVERY}: per-turn median, "
                     "first / last 1,000 turns", f"{first:.2f} / {last:.2f} ms ({last / first:.2f}x)",
                     f"flat (last <= {FLAT:g}x first)", verdict(last <= FLAT * first)))
    else:
        rows.append(("continue_as_new loop: per-turn median, first / last 1,000 turns", loop, "flat", "-"))
    common.print_table("Engine targets (this run)", rows)
    if isinstance(loop, dict):
        print("continue_as_new loop: " + json.dumps(loop))


if __name__ == "__main__":
    main()

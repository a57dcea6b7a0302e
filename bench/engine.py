"""Engine throughput, commit cost, replay, dispatch, recovery and scaling, beside DBOS Transact.

    .venv/bin/python bench/engine.py            # full sizes
    .venv/bin/python bench/engine.py --smoke    # tiny sizes (run by the test suite)

Prints one table. Figures:

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
* dispatch latency, recovery after SIGKILL and scaling from one worker process
  to two (``bench/engine_extra.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, dbos, engine_extra  # noqa: E402

STEPS_PER_RUN = 20


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
    from sagas.engine import advance
    from sagas.models import WorkflowRun

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
    from sagas import registry, systemdb
    from sagas.context import Context
    from sagas.models import WorkflowRun

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args()
    common.setup_django()
    runs, rounds, entries = (10, 1, 200) if args.smoke else (250, 5, 10_000)
    concurrencies = (1, 4)

    results: dict[int, list[Round]] = {c: [] for c in concurrencies}
    theirs: list[dict] = []
    for _ in range(rounds):
        for c in concurrencies:
            results[c].append(throughput_round(runs, c))
        theirs.append(dbos.measure(runs, 1))  # interleaved, so both see the same minutes of a noisy machine
    run_id, commits_long = long_run(entries)
    replay = replay_time(run_id, 1 if args.smoke else 5)
    extra_rows, extra_notes = engine_extra.measure(smoke=args.smoke, concurrencies=concurrencies)

    def med(c: int, field: str, fmt: str) -> str:
        return fmt.format(statistics.median(getattr(r, field) for r in results[c]))

    def per_concurrency(field: str, fmt: str) -> tuple[str, ...]:
        return tuple(med(c, field, fmt) for c in concurrencies)

    none = ("-",) * (len(concurrencies) - 1)
    dbos_steps = statistics.median(t["steps_per_s"][0] for t in theirs)
    dbos_commits = statistics.median(t["commits_per_step"] for t in theirs)
    rows = [
        ("figure", *(f"concurrency {c}" for c in concurrencies), "target"),
        ("pure steps per second, one worker process", *per_concurrency("steps_per_s", "{:.0f}"), "> 1000"),
        (f"DBOS Transact {theirs[0]['dbos_version']}: pure steps per second, one process, one workflow at a time",
         f"{dbos_steps:.0f}", *none, "-"),
        ("ours / DBOS, per worker process",
         *(f"{statistics.median(r.steps_per_s for r in results[c]) / dbos_steps:.2f}x" for c in concurrencies),
         ">= 2x"),
        ("DBOS commits per pure step (its default configuration)", f"{dbos_commits:.2f}", *none, "-"),
        (f"commits per pure step ({STEPS_PER_RUN}-step runs, with claim, journal load, finish)",
         *per_concurrency("commits_per_step", "{:.3f}"), "1"),
        (f"commits per step of one {entries}-step run", f"{commits_long:.4f}", *none, "1"),
        (f"time of one {STEPS_PER_RUN}-step run, claim to completed", *per_concurrency("run_ms", "{:.1f} ms"), "-"),
        ("gap between a thread's runs (finish, RQ, dequeue)", *per_concurrency("gap_ms", "{:.1f} ms"), "-"),
        (f"replay of a {entries}-entry journal", f"{replay * 1000:.0f} ms", *none, "< 500 ms"),
        *extra_rows,
    ]
    common.print_table(
        f"Engine (one worker process; runs={runs}x{STEPS_PER_RUN} steps, rounds={rounds}, median)", rows
    )
    for c in concurrencies:
        print(f"steps/s per round, concurrency {c}: " + ", ".join(f"{r.steps_per_s:.0f}" for r in results[c]))
    print("DBOS steps/s per round: " + ", ".join(f"{t['steps_per_s'][0]:.0f}" for t in theirs))
    for line in extra_notes:
        print(line)


if __name__ == "__main__":
    main()

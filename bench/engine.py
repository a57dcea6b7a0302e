"""Engine throughput, commit cost and replay time, on real workers and real PostgreSQL.

    .venv/bin/python bench/engine.py            # full sizes
    .venv/bin/python bench/engine.py --smoke    # tiny sizes (run by the test suite)

Prints a table. Figures: pure-step throughput of one worker process (20-step
workflows back to back, timed from the journal: first claim to last
completion), PostgreSQL commits per step (pg_stat_database.xact_commit over
the worker's whole life, start-up included), and the time to load and replay
a 10,000-entry journal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402


def xact_commits() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return cur.fetchone()[0]


def throughput(runs: int, rounds: int) -> dict[str, float]:
    from django.db import connection

    from sagas import start
    from sagas.models import WorkflowRun

    rates, commits_per_step = [], []
    for _ in range(rounds):
        common.reset_state()
        ids = [start("bench_pure20", {}).id for _ in range(runs)]
        time.sleep(1.0)  # let the stats collector settle before the baseline
        before = xact_commits()
        worker = common.spawn_worker("--burst", "--no-sweep")
        worker.wait(timeout=600)
        time.sleep(1.5)  # backends flush their stats at exit; the bench's own commits are excluded below
        after = xact_commits()
        done = WorkflowRun.objects.filter(id__in=ids, status="COMPLETED").count()
        if done != runs:
            raise SystemExit(f"only {done} of {runs} runs completed: {worker.stderr.read().decode()[-2000:]}")
        with connection.cursor() as cur:
            cur.execute(
                """SELECT extract(epoch FROM max(created_at) FILTER (WHERE kind = 'completed')
                                           - min(created_at) FILTER (WHERE kind = 'claimed'))
                     FROM sagas_journalentry"""
            )
            seconds = float(cur.fetchone()[0])
        steps = runs * 20
        rates.append(steps / seconds)
        # the bench process itself made 2 commits-worth of reads above (pg_stat reads are not commits
        # in autocommit SELECTs? they are: each autocommit statement counts); subtract them.
        commits_per_step.append((after - before - 2) / steps)
    return {
        "steps_per_s": statistics.median(rates),
        "commits_per_step": statistics.median(commits_per_step),
    }


def replay_time(entries: int, rounds: int) -> float:
    from sagas import registry, start, systemdb
    from sagas.context import Context
    from sagas.engine import advance
    from sagas.models import WorkflowRun

    common.reset_state()
    run = start("bench_long", {"steps": entries})
    advance(str(run.id), owner="bench")
    run.refresh_from_db()
    assert run.status == "COMPLETED", run.status
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
        ctx._check_finished()
        times.append(time.perf_counter() - t0)
        assert result == run.result
    assert WorkflowRun.objects.get(id=run.id).last_seq == run.last_seq  # replay wrote nothing
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args()
    common.setup_django()
    runs, rounds, entries = (10, 1, 200) if args.smoke else (250, 3, 10_000)

    tp = throughput(runs, rounds)
    replay = replay_time(entries, 1 if args.smoke else 5)
    common.print_table(
        f"Engine (runs={runs}x20 steps, rounds={rounds}, median)",
        [
            ("figure", "value", "target"),
            ("pure steps per second, one worker", f"{tp['steps_per_s']:.0f}", "> 1000"),
            ("commits per pure step (incl. claim/finish per run)", f"{tp['commits_per_step']:.3f}", "1"),
            (f"replay of a {entries}-entry journal", f"{replay * 1000:.0f} ms", "< 500 ms"),
        ],
    )


if __name__ == "__main__":
    main()

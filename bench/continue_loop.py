"""A 100,000-turn loop that continues as new every 200 turns, on a real worker: is a turn as
fast at the end as at the start?

    .venv/bin/python bench/continue_loop.py            # 100,000 turns, continue_as_new every 200
    .venv/bin/python bench/continue_loop.py --smoke    # 2,000 turns (run by the test suite)

One workflow (``bench/loop_workflows.py``): one step per turn (a scripted model reply), and
``ctx.continue_as_new`` every ``every`` turns, so no run's journal passes ``every`` steps and a
claim never replays more than that. One worker process (concurrency 1) runs the whole chain.

Per-turn latency comes from the journal: the time between a turn's entry and the previous
turn's (PostgreSQL's ``now()`` of each autocommit statement), across run boundaries, so a
turn that follows a continuation carries its cost (finish, new run, enqueue, dequeue, claim,
journal load). Printed: the medians (and p95) of the first and last 1,000 turns, their ratio,
the gap at a continuation, the longest journal of a run, and what one claim (load, replay, a
turn, finish; in this process) costs a run of ``every`` turns against one run of all of them.

Own database ``saga_bench_loop`` and Redis db 12 (``BENCH_LOOP_DATABASE_URL``,
``BENCH_LOOP_REDIS_URL``). ``measure()`` runs the bench in a child process with that
environment, so it can be called from another bench (``bench/engine.py``) that has set Django
up on its own database.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

LOOP_DB = os.environ.get("BENCH_LOOP_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_bench_loop")
LOOP_REDIS = os.environ.get("BENCH_LOOP_REDIS_URL", "redis://127.0.0.1:6379/12")
WINDOW = 1_000
LOCK_PATH = "/tmp/saga-bench-loop.lock"


def _env() -> dict[str, str]:
    return {"DATABASE_URL": LOOP_DB, "REDIS_URL": LOOP_REDIS, "SAGAS_MODULES": "bench.loop_workflows"}


def _turn_times() -> tuple[list[float], list[int]]:
    """Each turn's journal time (epoch seconds, in turn order), and the indexes of the turns
    that start a run other than the first (right after a continuation)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """SELECT (j.payload->'value'->>'turn')::int AS turn,
                      extract(epoch FROM j.created_at)::float8,
                      r.continued_from IS NOT NULL AND j.seq = (
                          SELECT min(seq) FROM sagas_journalentry f WHERE f.run_id = j.run_id AND f.kind = 'step')
                 FROM sagas_journalentry j JOIN sagas_workflowrun r ON r.id = j.run_id
                WHERE r.workflow_name = 'bench_loop' AND j.kind = 'step'
                ORDER BY turn"""
        )
        rows = cur.fetchall()
    return [t for _, t, _ in rows], [turn for turn, _, first in rows if first]


def _run(turns: int, every: int) -> dict[str, Any]:
    """In the child: the loop on a real worker, then the figures from its journal. One at a time
    (an flock): a second bench emptying the database under a first one lost the first's runs."""
    lock = open(LOCK_PATH, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    common.setup_django(**_env())
    from django.db import connection

    from sagas import start
    from sagas.models import WorkflowRun

    common.reset_state()
    connection.close()
    worker = common.spawn_worker("--no-sweep", "--concurrency", "1", env=common.bench_env(**_env()))
    began = time.monotonic()
    try:
        first = start("bench_loop", {"i": 0, "end": turns, "every": every})
        done = common.wait_for(
            lambda: WorkflowRun.objects.filter(workflow_name="bench_loop", status="COMPLETED", status_reason="",
                                               result__turns=turns).exists() or worker.poll() is not None,
            timeout=120 + turns / 50, interval=0.25,
        )
        wall = time.monotonic() - began
    finally:
        try:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(worker.pid, signal.SIGKILL)
    if not done or worker.returncode not in (0, -signal.SIGTERM, None):
        raise SystemExit(f"the loop did not finish (worker exit {worker.returncode}): "
                         f"{worker.stderr.read().decode(errors='replace')[-3000:] if worker.stderr else ''}")
    times, first_of_run = _turn_times()
    if len(times) != turns:
        raise SystemExit(f"{len(times)} turns journaled, expected {turns}")
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:])]  # gaps[k] is turn k+1's latency
    head, tail = gaps[:WINDOW], gaps[-WINDOW:]
    at_continuation = [gaps[i - 1] for i in first_of_run if i >= 1]
    runs = WorkflowRun.objects.filter(workflow_name="bench_loop").count()
    longest = max(WorkflowRun.objects.filter(workflow_name="bench_loop").values_list("last_seq", flat=True))
    first_median, last_median = common.median(head), common.median(tail)
    replay_chain, replay_single = _claim_with_history(every), _claim_with_history(turns)
    return {
        "turns": turns, "every": every, "runs": runs, "first_run": str(first.id),
        "wall_s": round(wall, 2), "turns_per_s": round(turns / (times[-1] - times[0]), 1),
        "first_median_ms": round(first_median, 3), "last_median_ms": round(last_median, 3),
        "first_p95_ms": round(common.percentile(head, 95), 3), "last_p95_ms": round(common.percentile(tail, 95), 3),
        "ratio": round(last_median / first_median, 3) if first_median else None,
        "continuation_median_ms": round(common.median(at_continuation), 3) if at_continuation else None,
        "continuations": len(at_continuation), "longest_journal": longest,
        "claim_every_ms": round(replay_chain, 1), "claim_all_ms": round(replay_single, 1),
    }


def _claim_with_history(recorded: int) -> float:
    """Milliseconds for this process to claim a ``bench_loop`` run whose journal already holds
    ``recorded`` turns, load and replay them, take one live turn and finish: what every claim of
    a loop (after a wait, a crash, a deploy) pays for its history. The journal is written by SQL,
    as a worker would have written it."""
    from django.db import connection

    from sagas import start
    from sagas.replay.engine import Outcome, advance

    run = start("bench_loop", {"i": 0, "end": recorded + 1, "every": recorded + 1})
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
               SELECT %s, 1 + g, 'step', CASE WHEN g = 1 THEN 'turn' ELSE 'turn#' || g END,
                      jsonb_build_object('value', jsonb_build_object(
                          'turn', g - 1, 'reply', 'scripted reply ' || (g - 1))), 'bench', now()
                 FROM generate_series(1, %s) AS g""",
            [run.id, recorded],
        )
        cur.execute("UPDATE sagas_workflowrun SET last_seq = %s, steps_used = %s WHERE id = %s",
                    [recorded + 1, recorded, run.id])
    began = time.perf_counter()
    outcome = advance(str(run.id), owner="bench-replay")
    elapsed = (time.perf_counter() - began) * 1000
    if outcome != Outcome.COMPLETED:
        raise SystemExit(f"the replay run ended {outcome}")
    return elapsed


def measure(turns: int = 100_000, every: int = 200) -> dict[str, Any]:
    """Run the loop (``turns`` turns, ``continue_as_new`` every ``every``) in a child process on
    its own database and Redis db, and return its figures:

    ``first_median_ms`` / ``last_median_ms`` (and ``_p95_ms``): per-turn latency over the first
    and the last 1,000 turns (fewer if ``turns`` is smaller); ``ratio`` (last / first, flat is
    1.0); ``continuation_median_ms``: a turn that follows a continuation; ``runs``,
    ``continuations``, ``longest_journal`` (entries of the longest run), ``turns_per_s``, ``wall_s``;
    ``claim_every_ms`` / ``claim_all_ms``: one claim of a run holding ``every`` / all ``turns`` turns
    (load, replay, one live turn, finish): what continuing as new saves each claim of a long loop.
    """
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--turns", str(turns), "--every", str(every)],
        cwd=common.ROOT, env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True, text=True, timeout=600 + turns / 20,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/continue_loop.py failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table_rows(figures: dict[str, Any]) -> list[tuple[str, str]]:
    n = min(WINDOW, figures["turns"] - 1)
    return [
        ("figure", "value"),
        (f"turns (continue_as_new every {figures['every']})", f"{figures['turns']:,}"),
        ("runs in the chain", f"{figures['runs']:,}"),
        (f"first {n:,} turns, median ms per turn", f"{figures['first_median_ms']:.3f}"),
        (f"last {n:,} turns, median ms per turn", f"{figures['last_median_ms']:.3f}"),
        ("last / first median", f"{figures['ratio']:.2f}"),
        (f"first {n:,} turns, p95 ms", f"{figures['first_p95_ms']:.3f}"),
        (f"last {n:,} turns, p95 ms", f"{figures['last_p95_ms']:.3f}"),
        ("turn after a continuation, median ms", f"{figures['continuation_median_ms'] or 0:.3f}"),
        ("longest journal of a run (entries)", f"{figures['longest_journal']:,}"),
        (f"a claim replaying {figures['every']:,} turns (a chain's run), ms", f"{figures['claim_every_ms']:.1f}"),
        (f"a claim replaying {figures['turns']:,} turns (one run, no continue_as_new), ms",
         f"{figures['claim_all_ms']:.1f}"),
        ("turns per second", f"{figures['turns_per_s']:.1f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="2,000 turns, for the test suite")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    turns = args.turns or (2_000 if args.smoke else 100_000)
    if args.child:
        print(json.dumps(_run(turns, args.every)))
        return
    figures = measure(turns=turns, every=args.every)
    common.print_table("Continue-as-new: per-turn latency of a long loop, one worker process", table_rows(figures))


if __name__ == "__main__":
    main()

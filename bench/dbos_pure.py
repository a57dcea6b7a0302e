"""DBOS Transact's pure-step throughput, on the shape of our ``bench_pure20``.

Runs inside the DBOS virtualenv that bench/dbos.py makes, never in ours: it
imports neither Django nor anything from this repository. bench/dbos.py starts
it with ``python -P``, so that bench/ (which holds our bench/dbos.py) does not
shadow the ``dbos`` package.

A workflow of 20 ``@DBOS.step()`` steps, each doubling a number, checkpointed in
DBOS's system database on PostgreSQL. The database is dropped and created anew
by DBOS at every start, so each invocation begins on empty tables; within one,
rounds differ only by the workflows' fresh ids. Each round starts N workflows
one at a time in this one process and waits for each result before starting
the next; steps/s is N*20 over the round's wall time.

Commits per step are read as bench/engine.py reads ours: the database's
``pg_stat_database.xact_commit`` before and after a round, after a pause that
lets the backends flush their statistics. DBOS's background threads commit
during those pauses too, which counts against it as our worker's start-up
counts against us. DBOS runs with its default configuration: a step is a
read-only transaction (workflow status, recorded output) and a write one (the
output), and its engine's ``pool_pre_ping`` adds a ``SELECT 1`` commit to each,
about 4.4 commits per step in all (2026-11-30).

Prints one line of JSON on stdout; DBOS's logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version

import psycopg
from dbos import DBOS, DBOSConfig

STEPS_PER_RUN = 20
STATS_FLUSH_S = 1.5  # PostgreSQL 15 backends flush statistics at most once a second


@DBOS.step()
def double(i: int) -> int:
    return i * 2


@DBOS.workflow()
def pure20() -> int:
    total = 0
    for i in range(STEPS_PER_RUN):
        total += double(i)
    return total


def xact_commits(conn: psycopg.Connection) -> int:
    """The database's commit counter. Its two autocommit statements are counted
    by the next reading: callers subtract them."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def run_workflows(n: int) -> list[str]:
    """Start ``n`` workflows one after the other, each awaited before the next."""
    ids = []
    for _ in range(n):
        handle = DBOS.start_workflow(pure20)
        if handle.get_result() != sum(2 * i for i in range(STEPS_PER_RUN)):
            raise SystemExit(f"workflow {handle.workflow_id} returned a wrong total")
        ids.append(handle.workflow_id)
    return ids


def check_checkpointed(conn: psycopg.Connection, workflow_id: str) -> None:
    """Refuse to measure unless DBOS really recorded the run and each of its steps'
    outputs, so the figure is of durable execution and not of plain calls."""
    status = conn.execute(
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", [workflow_id]
    ).fetchone()
    outputs = conn.execute(
        "SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid = %s AND output IS NOT NULL",
        [workflow_id],
    ).fetchone()
    if status != ("SUCCESS",) or outputs != (STEPS_PER_RUN,):
        raise SystemExit(f"DBOS did not checkpoint workflow {workflow_id}: status {status}, {outputs} step outputs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=250, help="workflows per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/saga_bench_dbos",
        help="DBOS's system database; DROPPED and re-created at start",
    )
    args = parser.parse_args()

    config: DBOSConfig = {
        "name": "saga-bench-dbos",
        "system_database_url": args.database_url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.reset_system_database()
    DBOS.launch()
    try:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            check_checkpointed(conn, run_workflows(max(1, min(args.runs, 20)))[0])  # also the warm-up
            per_round: list[float] = []
            commits: list[int] = []
            for _ in range(args.rounds):
                time.sleep(STATS_FLUSH_S)
                before = xact_commits(conn)
                t0 = time.perf_counter()
                run_workflows(args.runs)
                per_round.append(args.runs * STEPS_PER_RUN / (time.perf_counter() - t0))
                time.sleep(STATS_FLUSH_S)
                commits.append(xact_commits(conn) - before - 2)
    finally:
        DBOS.destroy()
    steps = args.runs * STEPS_PER_RUN * args.rounds
    result = {
        "dbos_version": version("dbos"),
        "steps_per_s": [round(s, 1) for s in per_round],
        "runs": args.runs,
        "steps_per_run": STEPS_PER_RUN,
        "commits_per_step": round(sum(commits) / steps, 3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

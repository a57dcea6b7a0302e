"""The replay check at scale: runs checked per second, and what checking one run costs against
loading and replaying its journal as a worker's replay does, in the same process on the same runs.

    .venv/bin/python bench/replay_check.py            # 10,000 runs of 20 steps
    .venv/bin/python bench/replay_check.py --smoke    # 300 runs (run by the test suite)

Its own database, ``saga_bench_replay`` (``saga_bench_replay_smoke`` with ``--smoke``), seeded
with ``bench_pure20`` runs (bench/workflows.py) whose journals hold their 20 steps, as a run
in flight whose last step was recorded leaves it. Rounds alternate:

* the check: ``sagas.replay.check.replay_check`` over every run (load the journal, replay it
  in the read-only, rolled-back transaction, classify);
* the replay: for each of the same runs, ``systemdb.load_journal`` and the workflow function
  under a plain ``Context`` until it returns, which is what a worker's replay of that run costs
  before it would act.

Target: a check costs at most 2 replays (the check is replay plus little).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

SIZES = {"full": {"runs": 10_000, "rounds": 3}, "smoke": {"runs": 300, "rounds": 1}}
STEPS = 20


def seed(runs: int) -> None:
    from django.db import connection

    from sagas.versions import registry

    definition = registry.get("bench_pure20", 1)
    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO sagas_workflowrun (id, workflow_name, version, definition_hash, input, business_key, tenant,
                                           status, status_reason, lease_owner, fence, attempts, last_seq, steps_used,
                                           cost_used, created_at, updated_at, started_at, started_via)
            SELECT gen_random_uuid(), 'bench_pure20', 1, %s, '{}'::jsonb, '', 'default', 'PENDING', '', '', 1, 1,
                   %s, %s, 0, now(), now(), now(), 'bench'
              FROM generate_series(1, %s)""", [definition.definition_hash, STEPS + 2, STEPS, runs])
        cur.execute("""
            INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
            SELECT r.id, 1, 'started', '', '{}'::jsonb, '', now() FROM sagas_workflowrun r
            UNION ALL
            SELECT r.id, 2, 'claimed', '', '{"attempt": 1, "fence": 1}'::jsonb, 'bench', now() FROM sagas_workflowrun r
            UNION ALL
            SELECT r.id, 2 + i, 'step', CASE WHEN i = 1 THEN 's' ELSE 's#' || i END,
                   jsonb_build_object('value', i - 1), 'bench', now()
              FROM sagas_workflowrun r, generate_series(1, %s) AS i""", [STEPS])
        cur.execute("ANALYZE sagas_workflowrun")
        cur.execute("ANALYZE sagas_journalentry")


def replay_plainly(runs: list) -> float:  # type: ignore[type-arg]
    """What a worker's replay of each run costs: its journal loaded, the code run to its end."""
    from sagas.replay.check import _claimed
    from sagas.replay.context import Context
    from sagas.store import systemdb
    from sagas.versions import registry

    definition = registry.get("bench_pure20", 1)
    began = time.perf_counter()
    for run in runs:
        ctx = Context(run=_claimed(run), journal=systemdb.load_journal(str(run.id)), worker_id="bench")
        definition.fn(ctx, run.input)
        ctx.check_finished()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "full"]
    db = "saga_bench_replay_smoke" if args.smoke else "saga_bench_replay"
    common.setup_django(DATABASE_URL=common.BENCH_DB.rsplit("/", 1)[0] + "/" + db)

    from sagas.models import WorkflowRun
    from sagas.replay.check import replay_check, runs_to_check
    from sagas.versions import registry

    common.reset_state()
    seed(size["runs"])
    definition = registry.get("bench_pure20", 1)
    runs = runs_to_check("bench_pure20", sample=0)
    assert len(runs) == size["runs"], len(runs)
    assert WorkflowRun.objects.count() == size["runs"]

    checks, replays = [], []
    for _ in range(size["rounds"]):
        report = replay_check(definition, runs)
        assert report.counts == {"compatible": size["runs"], "diverges": 0, "error": 0}, report.counts
        checks.append(report.seconds)
        replays.append(replay_plainly(runs))
    check, replay = common.median(checks), common.median(replays)
    n = size["runs"]
    common.print_table(
        f"Replay check, {n:,} runs of {STEPS} steps ({size['rounds']} round(s), medians; 2 cores, noisy: "
        f"compare the ratio, not the times)",
        [
            ("figure", "value", "target"),
            ("runs checked per second", f"{n / check:,.0f}", "–"),
            ("check, ms per run", f"{check / n * 1000:.2f}", "–"),
            ("replay (load + replay), ms per run", f"{replay / n * 1000:.2f}", "–"),
            ("check / replay", f"{check / replay:.2f}x", "at most 2x"),
        ],
    )


if __name__ == "__main__":
    main()

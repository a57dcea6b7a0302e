"""Dispatch latency (``start()`` to the first step) beside the cost of a one-row commit, measured
in the same minutes: ``bench/flow.py``'s dispatch rows, and runnable on its own.

    .venv/bin/python bench/flow_dispatch.py                      # 5 runs of 100, idle and busy
    .venv/bin/python bench/flow_dispatch.py --listen 0           # the same with RQ's wake-up only
    .venv/bin/python bench/flow_dispatch.py --smoke

Each run: ``pgbench`` (one client, one-row INSERTs, 3 s) just before and just after, then
``bench/engine_extra.py``'s dispatch measurement twice: one worker idle, and the same worker
beside a busy one (``dispatch_samples``: runs one at a time after a random pause, so the worker
waits in its dequeue when the wake-up comes). Targets (issue "Flow control"): in each run, p50 at
most 15 one-row commits of the same minutes, and p95 at most 1.5 x p50.

``--listen 0`` runs the workers with ``SAGAS_DISPATCH_LISTEN=0`` (RQ only), for a comparison in
the same hour.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

P50_COMMITS = 15.0
TAIL = 1.5


@dataclass(frozen=True)
class DispatchRound:
    commit_ms: float  # pgbench's mean latency, before and after the round
    idle: list[float]  # seconds, one per sample
    busy: list[float]

    @staticmethod
    def p(values: list[float], q: float) -> float:
        return 1000 * common.percentile(values, q)


def measure(*, runs: int, samples: int) -> list[DispatchRound]:
    from bench.engine import bracketed, pgbench_commits
    from bench.engine_extra import dispatch_samples

    rounds = []
    for _ in range(runs):
        before = pgbench_commits(3)
        idle = [d.total for d in dispatch_samples(samples).samples]
        busy = [d.total for d in dispatch_samples(samples, busy=True).samples]
        after = pgbench_commits(3)
        rounds.append(DispatchRound(bracketed(before, after).latency_ms, idle, busy))
    return rounds


def rows(rounds: list[DispatchRound]) -> list[tuple[str, ...]]:
    table: list[tuple[str, ...]] = [("run", "commit ms", "idle p50 / p95 ms", "idle p50 in commits", "idle p95/p50",
                                     "busy p50 / p95 ms", "busy p50 in commits", "busy p95/p50", "targets met")]
    for i, r in enumerate(rounds, 1):
        cells: list[str] = [str(i), f"{r.commit_ms:.3f}"]
        met = True
        for values in (r.idle, r.busy):
            p50, p95 = r.p(values, 50), r.p(values, 95)
            commits, tail = p50 / r.commit_ms, p95 / p50
            met = met and commits <= P50_COMMITS and tail <= TAIL
            cells += [f"{p50:.2f} / {p95:.2f}", f"{commits:.1f}", f"{tail:.2f}"]
        cells.append("yes" if met else "no")
        table.append(tuple(cells))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--listen", choices=("0", "1"), default="1", help="SAGAS_DISPATCH_LISTEN of the workers")
    args = parser.parse_args()
    os.environ["SAGAS_DISPATCH_LISTEN"] = args.listen
    common.setup_django()
    rounds = measure(runs=1, samples=5) if args.smoke else measure(runs=5, samples=100)
    common.print_table(f"Dispatch, start() to the first step (SAGAS_DISPATCH_LISTEN={args.listen})", rows(rounds))
    medians = [statistics.median(r.idle) * 1000 / r.commit_ms for r in rounds]
    print(f"idle p50 in commits, per run: {', '.join(f'{m:.1f}' for m in medians)} (target <= {P50_COMMITS:g})")


if __name__ == "__main__":
    main()

"""Tick lateness of many schedules sharing a tick, fired by real sweeper processes.

    .venv/bin/python bench/schedules.py                 # 1,000 schedules every minute, 3 ticks, 2 sweepers
    .venv/bin/python bench/schedules.py --smoke         # 50 schedules every 5 s, 2 ticks (the test suite)

Every schedule ticks on the same instants (an interval schedule ticks at the multiples of its
interval), the worst case for a sweeper: at each tick all of them are due at once. Two
``sagas_sweep --loop`` processes (the default interval, ``SAGAS_SWEEP_INTERVAL``) race for them.
Lateness is each tick's ``handled_at`` minus the tick (no jitter). No worker runs the runs: this
measures firing, not running (they stay PENDING; the overlap policy is ``allow_all``).

Target (issue "Schedules and child workflows"): p95 lateness within one sweep interval of the
tick. The table also says how many ticks were fired, and checks each was started once (one
tick record, one run, per schedule and tick). Exit 1 when a tick was not fired or fired twice,
or (not with ``--smoke``) the lateness target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

SWEEPERS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="50 schedules every 5 s, 2 ticks")
    parser.add_argument("--schedules", type=int, default=None, help="default 1,000 (smoke 50)")
    parser.add_argument("--every", type=int, default=None, help="seconds between ticks (default 60; smoke 5)")
    parser.add_argument("--ticks", type=int, default=None, help="ticks to wait for (default 3; smoke 2)")
    args = parser.parse_args()
    count = args.schedules or (50 if args.smoke else 1000)
    every = args.every or (5 if args.smoke else 60)
    ticks = args.ticks or (2 if args.smoke else 3)

    common.setup_django()
    from django.conf import settings

    from sagas import schedule
    from sagas.models import Schedule, ScheduleTick, WorkflowRun
    from sagas.schedules.services import schedule_create

    common.reset_state()
    Schedule.objects.all().delete()
    started = time.monotonic()
    for n in range(count):
        spec = schedule(f"bench-{n:05d}", every=timedelta(seconds=every), overlap="allow_all", input={"n": n})
        schedule_create(spec=dataclasses.replace(spec, workflow="bench_dispatch"))
    made = time.monotonic() - started
    first = Schedule.objects.order_by("next_tick_at").values_list("next_tick_at", flat=True).first()
    interval = settings.SAGAS_SWEEP_INTERVAL
    env = common.bench_env(SAGAS_LOG_LEVEL="WARNING")
    sweepers = [subprocess.Popen([sys.executable, "manage.py", "sagas_sweep", "--loop"], cwd=common.ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
                for _ in range(SWEEPERS)]
    try:
        last_tick = first + timedelta(seconds=every * (ticks - 1))
        deadline = time.monotonic() + every * ticks + 120
        common.wait_for(lambda: ScheduleTick.objects.filter(tick_at=last_tick).count() >= count,
                        max(1.0, deadline - time.monotonic()), interval=0.5)
    finally:
        for proc in sweepers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in sweepers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    measured = list(ScheduleTick.objects.filter(tick_at__gte=first, tick_at__lte=last_tick)
                    .values_list("tick_at", "handled_at", "outcome", "run_id"))
    late = [(handled - tick).total_seconds() for tick, handled, _, _ in measured]
    started_runs = {run for _, _, outcome, run in measured if outcome == "started"}
    runs = WorkflowRun.objects.filter(workflow_name="bench_dispatch").count()
    expected = count * ticks
    p50, p95 = common.percentile(late, 50), common.percentile(late, 95)
    once = len(measured) == expected and len(started_runs) == expected == runs
    met = once and p95 <= interval
    common.print_table(
        f"Schedules: {count} schedules every {every} s, {ticks} ticks, {SWEEPERS} sweepers "
        f"(sweep interval {interval:g} s)",
        [
            ("measure", "value", "target"),
            ("ticks fired", f"{len(measured)} of {expected}", "all"),
            ("runs started (one per tick, none twice)", f"{len(started_runs)} ({runs} runs in all)", f"{expected}"),
            ("tick lateness p50 / p95 / max", f"{p50:.2f} / {p95:.2f} / {max(late, default=0):.2f} s",
             f"p95 <= {interval:g} s (one sweep)"),
            ("creating the schedules", f"{made:.1f} s ({count / made:.0f}/s)", "-"),
        ],
    )
    print("Targets: met" if met else "Targets: MISSED")
    Schedule.objects.all().delete()
    # A tick not fired, or fired twice, fails every run; lateness only a full one (the smoke run
    # shares two cores with the test suite).
    sys.exit(0 if once and (met or args.smoke) else 1)


if __name__ == "__main__":
    main()

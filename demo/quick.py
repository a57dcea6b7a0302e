"""The v1 demo (``manage.py demo --quick``): orders crash-tested on two workers.

Run by the demo command once its processes are set up; ``cmd`` is that command
(its supervisor, options, run directory and stop event).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from demo.supervisor import LEASE_TTL, forget_rq_worker, shown

if TYPE_CHECKING:
    from demo.management.commands.demo import Command


def run_quick(cmd: Command) -> None:
    """``demo --quick``: 20 orders on two workers, one SIGKILLed mid-way, every journal entry printed."""
    from sagas import start
    from sagas.models import JournalEntry, RunStatus, WorkflowRun

    o = cmd.options
    for name in ("worker-1", "worker-2"):
        forget_rq_worker(name)
        cmd.sup.spawn(name, "manage.py", "sagas_worker", "--name", name, "--no-sweep", quiet=True)
    cmd.sup.spawn("sweeper", "manage.py", "sagas_sweep", "--loop", quiet=True)
    cmd.say(f"started worker-1, worker-2 and the sweeper (logs in {shown(cmd.run_dir)}/); "
             f"lease TTL {LEASE_TTL}s")

    batch = time.strftime("%H%M%S")
    runs: dict[str, str] = {}
    for i in range(1, o["runs"] + 1):
        order: dict[str, Any] = {"id": f"order-{batch}-{i:02d}", "sku": f"SKU-{i % 4 + 1}", "qty": i % 3 + 1}
        run = start("order_fulfilment", order, business_key=order["id"], started_via="demo")
        runs[str(run.id)] = order["id"]
    cmd.say(f"started {len(runs)} order_fulfilment runs\n")

    t0 = time.monotonic()
    last_id = JournalEntry.objects.filter(run_id__in=runs).order_by("id").values_list("id", flat=True).first() or 0
    killed = o["no_kill"]
    while True:
        if cmd.stop.is_set():
            cmd.say("\ninterrupted: stopping workers and sweeper")
            raise SystemExit(130)
        entries = list(
            JournalEntry.objects.filter(run_id__in=runs, id__gt=last_id)
            .exclude(kind="started")
            .order_by("id")
            .values_list("id", "run_id", "kind", "name", "worker_id")
        )
        for entry_id, run_id, kind, name, worker in entries:
            last_id = entry_id
            what = f"{kind} {name}".strip()
            cmd.say(f"{time.monotonic() - t0:6.2f}s  {runs[str(run_id)]}  {what:<22} {worker}")
        statuses = Counter(WorkflowRun.objects.filter(id__in=runs).values_list("status", flat=True))
        done = statuses.get(RunStatus.COMPLETED, 0)
        if not killed and done >= len(runs) // 4:
            cmd.kill_worker("worker-1", f"{time.monotonic() - t0:6.2f}s")
            killed = True
        if done == len(runs):
            break
        stuck = {s: n for s, n in statuses.items() if s in (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)}
        if stuck:
            raise CommandError(f"runs ended badly: {stuck}; see {cmd.run_dir}/*.log")
        if time.monotonic() - t0 > o["timeout"]:
            raise CommandError(f"timed out after {o['timeout']:.0f}s: {dict(statuses)}")
        cmd.stop.wait(0.2)
    _summary(cmd, runs, time.monotonic() - t0)

def _summary(cmd: Command, runs: dict[str, str], elapsed: float) -> None:
    from sagas.models import JournalEntry, RunStatus, WorkflowRun

    qs = WorkflowRun.objects.filter(id__in=runs)
    steps = sum(qs.values_list("steps_used", flat=True))
    resumed = qs.filter(attempts__gt=1).count()
    names = Counter(JournalEntry.objects.filter(run_id__in=runs, kind="step").values_list("run_id", "name"))
    repeated = sum(1 for n in names.values() if n > 1)
    cmd.say(
        f"\nsummary: {qs.filter(status=RunStatus.COMPLETED).count()}/{len(runs)} runs COMPLETED in {elapsed:.1f}s; "
        f"{steps} steps journaled; {resumed} run(s) resumed on another worker after a crash; "
        f"{repeated} step(s) journaled twice (must be 0)"
    )
    if repeated:
        raise CommandError("a step was journaled twice")


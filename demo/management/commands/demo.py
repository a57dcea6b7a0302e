"""``make demo``: real workers, a sweeper, 20 runs, one worker killed mid-way, live progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun

ROOT = Path(settings.BASE_DIR)
LEASE_TTL = "5"


class Command(BaseCommand):
    help = "Run the demo: two workers and a sweeper complete 20 order workflows, surviving a SIGKILL."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--runs", type=int, default=20)
        parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-way")
        parser.add_argument("--timeout", type=float, default=180.0)

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        call_command("sagas_ensuredb")
        call_command("migrate", verbosity=0)
        self.procs: dict[str, subprocess.Popen] = {}
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._run(options)
        except KeyboardInterrupt:
            self.stdout.write("\ninterrupted: stopping workers and sweeper")
            raise SystemExit(130) from None
        finally:
            self._stop_all()

    # --- processes ---------------------------------------------------------

    def _spawn(self, name: str, *args: str) -> None:
        env = dict(os.environ, SAGAS_LEASE_TTL=LEASE_TTL, SAGAS_SWEEP_INTERVAL="1", PYTHONUNBUFFERED="1")
        log = open(ROOT / ".run" / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # --- the demo ------------------------------------------------------------

    def _run(self, options: dict) -> None:
        (ROOT / ".run").mkdir(exist_ok=True)
        for name in ("worker-1", "worker-2"):
            self._spawn(name, "sagas_worker", "--name", name, "--no-sweep")
        self._spawn("sweeper", "sagas_sweep", "--loop")
        self.stdout.write(f"started worker-1, worker-2 and the sweeper (logs in .run/); lease TTL {LEASE_TTL}s")

        batch = time.strftime("%H%M%S")
        runs = {}
        for i in range(1, options["runs"] + 1):
            order = {"id": f"order-{batch}-{i:02d}", "sku": f"SKU-{i % 4 + 1}", "qty": i % 3 + 1}
            run = start("order_fulfilment", order, business_key=order["id"], started_via="demo")
            runs[str(run.id)] = order["id"]
        self.stdout.write(f"started {len(runs)} order_fulfilment runs\n")

        t0 = time.monotonic()
        last_id = JournalEntry.objects.filter(run_id__in=runs).order_by("id").values_list("id", flat=True).first() or 0
        killed = options["no_kill"]
        while True:
            entries = list(
                JournalEntry.objects.filter(run_id__in=runs, id__gt=last_id)
                .exclude(kind="started")
                .order_by("id")
                .values_list("id", "run_id", "kind", "name", "worker_id")
            )
            for entry_id, run_id, kind, name, worker in entries:
                last_id = entry_id
                label = runs[str(run_id)]
                what = f"{kind} {name}".strip()
                self.stdout.write(f"{time.monotonic() - t0:6.2f}s  {label}  {what:<22} {worker}")
            statuses = Counter(WorkflowRun.objects.filter(id__in=runs).values_list("status", flat=True))
            done = statuses.get(RunStatus.COMPLETED, 0)
            if not killed and done >= len(runs) // 4:
                self._kill_and_restart("worker-1", t0)
                killed = True
            if done == len(runs):
                break
            stuck = {s: n for s, n in statuses.items() if s in (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)}
            if stuck:
                raise CommandError(f"runs ended badly: {stuck}; see .run/*.log")
            if time.monotonic() - t0 > options["timeout"]:
                raise CommandError(f"timed out after {options['timeout']:.0f}s: {dict(statuses)}")
            time.sleep(0.2)
        self._summary(runs, time.monotonic() - t0)

    def _kill_and_restart(self, name: str, t0: float) -> None:
        proc = self.procs[name]
        busy = WorkflowRun.objects.filter(lease_owner=name, status=RunStatus.RUNNING).first()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        note = f" while it held {busy.business_key}" if busy else ""
        self.stdout.write(
            f"{time.monotonic() - t0:6.2f}s  ** SIGKILL {name}{note}; its lease expires within {LEASE_TTL}s "
            f"and the sweeper hands the run to another worker **"
        )
        self._spawn(name, "sagas_worker", "--name", name, "--no-sweep")

    def _summary(self, runs: dict[str, str], elapsed: float) -> None:
        qs = WorkflowRun.objects.filter(id__in=runs)
        steps = sum(qs.values_list("steps_used", flat=True))
        resumed = qs.filter(attempts__gt=1).count()
        names = Counter(
            JournalEntry.objects.filter(run_id__in=runs, kind="step").values_list("run_id", "name")
        )
        repeated = sum(1 for n in names.values() if n > 1)
        self.stdout.write(
            f"\nsummary: {qs.filter(status=RunStatus.COMPLETED).count()}/{len(runs)} runs COMPLETED in {elapsed:.1f}s; "
            f"{steps} steps journaled; {resumed} run(s) resumed on another worker after a crash; "
            f"{repeated} step(s) journaled twice (must be 0)"
        )
        if repeated:
            raise CommandError("a step was journaled twice")

"""A simulated crash table, reproduced with the real engine, real worker processes and real SIGKILLs.

    .venv/bin/python bench/chaos.py            # 400 runs per cell, 3 strategies x 3 crash chances
    .venv/bin/python bench/chaos.py --smoke    # 8 runs per strategy at chance 0.20 (the test suite runs it)

A simulation ran, in memory, 400 runs of a 7-step agent (model cost 8.0 per run
without crashes, 3 effects) under three strategies. Here each run is a real workflow
run (``bench/chaos_workflows.py``) advanced by a pool of ``sagas_worker`` processes
against the real simulated providers. A step that really executes crashes with the
cell's chance, at one of the simulation's three positions (before the work, after it but
before its result is recorded, after that): the worker SIGKILLs itself, the pool
forks a replacement, and the run is picked up by another worker when its lease
expires (as in production, through the sweeper).

Workers are forked from this process after Django is loaded, as ``gunicorn
--preload`` does: each is a full ``sagas_worker`` with its own connections, but a
respawn costs milliseconds instead of the 2 s of CPU that starting Python and
Django takes here, which over a thousand kills would dominate the run.

Every figure is counted where it happened: model cost and effect executions at
the providers (their own tables), restarts by the pool (children that died of
SIGKILL), runs lost from the runs table (not COMPLETED when the cell ended).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

STRATEGIES = (  # (label, workflow)
    ("restart from scratch", "chaos_restart"),
    ("journal, no idempotency key", "chaos_journal"),
    ("journal + ledger and keys", "chaos_keyed"),
)
# The simulation's figures: cost per run by crash chance (restart, journal), and at 0.08
# (cost, restarts, duplicates) per strategy.
SIMULATED_COST = {0.02: (9.02, 8.06), 0.08: (11.94, 8.24), 0.20: (25.50, 8.53)}
SIMULATED_AT_008 = {"chaos_restart": (12.43, 0.86, 243), "chaos_journal": (8.22, 0.63, 35),
               "chaos_keyed": (8.22, 0.63, 0)}
LEASE_TTL, SWEEP_INTERVAL = 1.0, 0.25  # the settings' minimum TTL: a crashed run waits least
SETTLED = ("COMPLETED", "FAILED", "CANCELLED", "COMPENSATED", "NEEDS_ATTENTION")  # nothing moves without a person


@dataclass
class Cell:
    label: str
    workflow: str
    chance: float
    runs: int
    cost_per_run: float
    model_repeats: int  # billed model calls beyond one per step
    restarts_per_run: float
    duplicates: int  # effect executions beyond one per logical effect
    lost: int  # runs not COMPLETED when the cell ended
    seconds: float


class WorkerPool:
    """``size`` worker processes forked from this one; each that dies is replaced at once."""

    def __init__(self, size: int, log_path: Path) -> None:
        from django.core.management import load_command_class

        self.size, self.log_path = size, log_path
        # Loaded here, before any fork: every worker then runs the code this process loaded
        # at its start, even if the checkout changes while the benchmark runs.
        self.command = load_command_class("sagas", "sagas_worker")
        self.pids: set[int] = set()
        self.kills = 0  # children that died of SIGKILL: the crashes
        self.other_exits: list[str] = []

    def __enter__(self) -> WorkerPool:
        for _ in range(self.size):
            self._spawn()
        return self

    def __exit__(self, *exc: object) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            os.waitpid(pid, 0)
        self.pids.clear()

    def _spawn(self) -> None:
        from django.db import connections

        connections.close_all()  # a child must not share this process's database socket
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            common.forget_inherited_connections()
            try:
                log = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                from django.core.management import call_command

                call_command(self.command, "--name", f"chaos-{os.getpid()}")
                code = 0
            except BaseException:  # noqa: BLE001  (the parent reports the exit; the log has the trace)
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.pids.add(pid)

    def reap(self) -> None:
        """Replace every worker that has died since the last call."""
        while self.pids:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.pids.discard(pid)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                self.kills += 1
            else:
                self.other_exits.append(f"pid {pid}: wait status {status}")
            self._spawn()


def reset() -> None:
    from django.db import connection

    common.reset_state()
    with connection.cursor() as cur:
        cur.execute("TRUNCATE demo_providerexecution, demo_providerreplay, demo_providerfault CASCADE")


def run_cell(label: str, workflow: str, chance: float, runs: int, workers: int, stall: float,
             log_path: Path) -> Cell:
    from sagas import start
    from sagas.models import WorkflowRun

    reset()
    os.environ["BENCH_CRASH_CHANCE"] = str(chance)  # the forked workers read it on every roll
    ids = [start(workflow, {}).id for _ in range(runs)]
    began = time.monotonic()
    progress, moved = (-1, -1), began
    with WorkerPool(workers, log_path) as pool:
        while True:
            pool.reap()
            settled = WorkflowRun.objects.filter(id__in=ids, status__in=SETTLED).count()
            if settled == runs:
                break
            if (settled, pool.kills) != progress:
                progress, moved = (settled, pool.kills), time.monotonic()
            elif time.monotonic() - moved > stall:
                break  # nothing settled and nobody crashed for `stall` seconds: what is left is lost
            time.sleep(0.1)
        seconds = time.monotonic() - began
        pool.reap()
    if pool.other_exits:
        raise SystemExit(f"workers exited other than by SIGKILL ({pool.other_exits[:3]}); see {log_path}")
    return measure(label, workflow, chance, ids, pool.kills, seconds)


def measure(label: str, workflow: str, chance: float, ids: list, kills: int, seconds: float) -> Cell:
    from sagas.models import WorkflowRun

    cost, model_repeats, duplicates = common.provider_books()
    completed = WorkflowRun.objects.filter(id__in=ids, status="COMPLETED").count()
    return Cell(label, workflow, chance, len(ids), cost / len(ids), model_repeats, kills / len(ids), duplicates,
                len(ids) - completed, seconds)


def draw(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, workflow in STRATEGIES:
        points = sorted((c.chance, c.cost_per_run) for c in cells if c.workflow == workflow)
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"{label} (measured)")
    chances = sorted(SIMULATED_COST)
    for i, label in enumerate(("restart (simulated)", "journal (simulated)")):
        ax.plot(chances, [SIMULATED_COST[x][i] for x in chances], linestyle="--", color="grey", alpha=0.6,
                marker="x", label=label)
    ax.axhline(8.0, color="black", linewidth=0.6, linestyle=":", label="no crashes (8.0)")
    ax.set_xlabel("crash chance per step")
    ax.set_ylabel("model cost per run")
    ax.set_title(f"Model cost per run under real SIGKILLs ({cells[0].runs} runs per point)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def print_tables(cells: list[Cell], workers: int) -> None:
    rows = [("strategy", "crash chance", "model cost per run", "model calls repeated", "restarts per run",
             "duplicate effects", "runs lost", "simulated at 0.08 (cost, restarts, dup.)", "wall time")]
    for c in cells:
        sim = SIMULATED_AT_008[c.workflow] if c.chance == 0.08 else None
        rows.append((c.label, f"{c.chance:.2f}", f"{c.cost_per_run:.2f}", str(c.model_repeats),
                     f"{c.restarts_per_run:.2f}", str(c.duplicates), str(c.lost),
                     f"{sim[0]:.2f}, {sim[1]:.2f}, {sim[2]}" if sim else "-", f"{c.seconds:.0f} s"))
    common.print_table(
        f"Chaos ({cells[0].runs} runs per cell, {workers} worker processes, lease TTL {LEASE_TTL:g} s, "
        f"sweep every {SWEEP_INTERVAL:g} s)", rows,
    )
    by = {(c.workflow, c.chance): c for c in cells}
    rows = [("crash chance", "restart: simulated", "restart: measured", "journal: simulated", "journal: measured",
             "product: measured")]
    for chance in sorted({c.chance for c in cells}):
        sim = SIMULATED_COST.get(chance, (float("nan"),) * 2)
        got = [by.get((w, chance)) for _, w in STRATEGIES]
        rows.append((f"{chance:.2f}", f"{sim[0]:.2f}", *(f"{g.cost_per_run:.2f}" if g else "-" for g in got[:1]),
                     f"{sim[1]:.2f}", *(f"{g.cost_per_run:.2f}" if g else "-" for g in got[1:])))
    common.print_table("Model cost per run by crash chance (no crashes: 8.00)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="8 runs per strategy at chance 0.20, for the test suite")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell (default 400; smoke 8)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--chances", default=None, help="comma-separated crash chances (default 0.02,0.08,0.20)")
    parser.add_argument("--png", type=Path, default=common.ROOT / "bench" / "figures" / "chaos.png")
    args = parser.parse_args()
    runs = args.runs or (8 if args.smoke else 400)
    chances = [float(x) for x in (args.chances or ("0.20" if args.smoke else "0.02,0.08,0.20")).split(",")]

    common.setup_django(SAGAS_MODULES="bench.chaos_workflows", SAGAS_LEASE_TTL=str(LEASE_TTL),
                        SAGAS_SWEEP_INTERVAL=str(SWEEP_INTERVAL), BENCH_CRASH_CHANCE="0")
    from django.conf import settings

    providers, url = common.start_providers(common.bench_env())
    settings.DEMO_PROVIDERS_URL = url  # forked workers inherit it
    log_path = Path(tempfile.mkstemp(prefix="chaos-workers-", suffix=".log")[1])
    cells = []
    try:
        for chance in chances:
            for label, workflow in STRATEGIES:
                cells.append(run_cell(label, workflow, chance, runs, args.workers, stall=30 * LEASE_TTL,
                                      log_path=log_path))
                print(f"  {label} at {chance:.2f}: done in {cells[-1].seconds:.0f} s", file=sys.stderr)
    finally:
        providers.terminate()
        providers.wait(timeout=10)
    print_tables(cells, args.workers)
    draw(cells, args.png)
    print(f"chart: {args.png}")
    log_path.unlink()


if __name__ == "__main__":
    main()

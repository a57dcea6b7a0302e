"""One pydantic-ai agent under real SIGKILLs, three ways: plain, pydantic-ai's DBOS integration, ours.

    .venv/bin/python bench/agents.py              # 400 runs per cell, 3 variants x 3 crash chances (about 15 min)
    .venv/bin/python bench/agents.py --smoke      # 8 runs per variant at chance 0.20 (the test suite runs it)

The agent (bench/agents_shared.py) is a scripted ``FunctionModel`` of four turns,
each a completion billed 2.0 at the demo's model gateway (8.0 per run without
crashes), and three side-effecting tools against the simulated providers
(payments capture, inventory reserve, shipping create). It runs:

1. **plain**: ``agent.run_sync`` per run, in ``--workers`` processes forked from
   this one; a killed process is started again and starts every unfinished run
   from scratch (a run is finished once its output is written to a file).
2. **dbos**: pydantic-ai's own integration (``pydantic_ai.durable_exec.dbos``,
   ``DBOSDurability``; tools are ``@DBOS.step()``s) with DBOS Transact 3.4, in
   its own virtualenv ``.bench/agents-dbos`` made on first use, one process per
   slot (bench/agents_dbos_pure.py); a killed process is started again, and
   ``DBOS.launch()`` recovers its pending workflow from DBOS's checkpoints.
3. **ours**: ``sagas.agents.run_agent`` in a workflow (bench/agents_workflows.py),
   advanced by bench/chaos.py's pool of forked ``sagas_worker`` processes.

The crash model is bench/chaos.py's (see bench/agents_shared.py): every model
turn and tool call that really executes crashes with the cell's chance, before
the work, after it but before its record, or after the record.

Each size has its own database and Redis db (full: saga_bench_agents and 13; smoke:
saga_bench_agents_smoke and 10), and DBOS its own database beside it (``<that>_dbos``).

Counted where it happened: model cost and tool executions at the providers
(their own tables), restarts by the supervisor (children dead of SIGKILL),
effects UNKNOWN in our ledger (plain code and DBOS record no such state: their
column is 0 because nothing can say "unknown"), runs lost (not finished when
the cell ended, or when nothing moved for 30 s).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

VARIANTS = (  # (label, variant)
    ("plain pydantic-ai, restarted from scratch", "plain"),
    ("pydantic-ai + DBOS (durable_exec.dbos)", "dbos"),
    ("ours (sagas.agents.run_agent)", "ours"),
)
LEASE_TTL, SWEEP_INTERVAL = 1.0, 0.25  # as bench/chaos.py
STALL_S = 30.0
NO_CRASH_COST = 8.0
VENV = common.ROOT / ".bench" / "agents-dbos"
REQUIREMENTS = ("dbos==3.4.*", "pydantic-ai-slim[dbos]==2.68.0")  # pydantic-ai as in our venv
DBOS_SCRIPT = common.ROOT / "bench" / "agents_dbos_pure.py"
# Their own databases and Redis dbs (as bench/bulk.py), so the suite's smoke run never empties
# the tables of a full run going on beside it, nor the other way round.
SIZES = {"full": dict(db="saga_bench_agents", redis=13), "smoke": dict(db="saga_bench_agents_smoke", redis=10)}


@dataclass
class Cell:
    label: str
    variant: str
    chance: float
    runs: int
    cost_per_run: float
    model_repeats: int  # billed model turns beyond one per turn
    restarts_per_run: float
    duplicates: int  # tool executions beyond one per logical tool call
    unknown: int  # effects left UNKNOWN (ours only: the others have no such state)
    lost: int
    seconds: float


# --- processes ------------------------------------------------------------------------


class Proc(Protocol):
    def poll(self) -> int | None: ...  # None while running; -N when killed by signal N

    def kill(self) -> None: ...

    def dump_stacks(self) -> None: ...  # into the log, if the process can


class Forked:
    """A child forked from this process, running ``target()``; exit 0 when it returns."""

    def __init__(self, target: Callable[[], None], log_path: Path) -> None:
        from django.db import connections

        connections.close_all()  # a child must not share this process's database socket
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            common.forget_inherited_connections()
            try:
                log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                target()
                code = 0
            except BaseException:  # noqa: BLE001  (the parent reports the exit; the log has the trace)
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.code

    def dump_stacks(self) -> None:
        pass  # a plain run cannot hang on anything but the providers, whose log says so

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.code = -signal.SIGKILL


class Popened:
    def __init__(self, command: list[str], env: dict[str, str], log_path: Path) -> None:
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def poll(self) -> int | None:
        return self.proc.poll()

    def dump_stacks(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # bench/agents_dbos_pure.py registers faulthandler on it

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def supervise(spawn: Callable[[int], Proc], slots: int, finished: Callable[[], int],
              log_path: Path) -> tuple[int, float]:
    """Keep one process per slot until each has exited 0, starting again every one killed
    by SIGKILL; stop when nothing finished and nobody crashed for STALL_S seconds.
    Returns (kills, seconds)."""
    procs = {slot: spawn(slot) for slot in range(slots)}
    kills, began = 0, time.monotonic()
    progress, moved = (-1, -1), began
    try:
        while procs:
            for slot, proc in list(procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                if code == -signal.SIGKILL:
                    kills += 1
                    procs[slot] = spawn(slot)
                elif code == 0:
                    del procs[slot]
                else:
                    raise SystemExit(f"slot {slot} exited with {code}, not by SIGKILL; see {log_path}")
            now = time.monotonic()
            if (finished(), kills) != progress:
                progress, moved = (finished(), kills), now
            elif now - moved > STALL_S:
                for proc in procs.values():
                    proc.dump_stacks()
                time.sleep(1)
                break  # what is not finished is lost
            time.sleep(0.05)
        return kills, time.monotonic() - began
    finally:
        for proc in procs.values():
            proc.kill()


# --- variant 1: plain -------------------------------------------------------------------


def plain_slot(refs: list[str], done_path: Path) -> None:
    """Run every ref not yet written to ``done_path``, each from scratch."""
    from bench import agents_shared as shared

    done = set(done_path.read_text().split())
    agent = shared.plain_agent()
    for ref in refs:
        if ref in done:
            continue
        output = agent.run_sync(shared.prompt(ref)).output
        shared.finished(ref)  # a crash after the last turn: the output is not written, the run starts over
        if output != shared.FINAL.format(ref=ref):
            raise SystemExit(f"run {ref} answered {output!r}")
        with open(done_path, "a") as done_file:
            done_file.write(ref + "\n")


def run_plain(refs: list[str], workers: int, log_path: Path) -> tuple[int, float, int]:
    done_path = Path(tempfile.mkstemp(prefix="agents-plain-done-")[1])
    try:
        kills, seconds = supervise(
            lambda slot: Forked(lambda: plain_slot(refs[slot::workers], done_path), log_path), workers,
            lambda: len(done_path.read_text().split()), log_path,
        )
        finished = len(set(done_path.read_text().split()) & set(refs))
    finally:
        done_path.unlink()
    return kills, seconds, len(refs) - finished


# --- variant 2: DBOS ----------------------------------------------------------------------


def dbos_database_url() -> str:
    """The bench database's name + ``_dbos``, on its server: DBOS drops and re-creates it per cell."""
    parts = urlsplit(common.BENCH_DB)
    return urlunsplit(parts._replace(path=parts.path + "_dbos"))


def venv_ready() -> bool:
    """Whether the DBOS virtualenv is there with these very requirements in (nothing is installed)."""
    stamp = VENV / ".installed"
    return stamp.exists() and stamp.read_text() == " ".join(REQUIREMENTS) and (VENV / "bin" / "python").exists()


def ensure_venv() -> Path:
    """The DBOS virtualenv's interpreter, made and filled from PyPI unless its stamp says
    these very requirements are in (about 10 s here with a warm pip cache)."""
    python, stamp = VENV / "bin" / "python", VENV / ".installed"
    wanted = " ".join(REQUIREMENTS)
    if venv_ready():
        return python
    began = time.monotonic()
    if not python.exists():
        _run_or_exit([sys.executable, "-m", "venv", str(VENV)], "creating the DBOS virtualenv")
    _run_or_exit([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
                 f"installing {wanted}")
    stamp.write_text(wanted)
    print(f"  made {VENV} ({wanted}) in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return python


def _run_or_exit(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def run_dbos(refs: list[str], workers: int, log_path: Path, python: Path, env: dict[str, str]) -> tuple[int, float, int]:
    import psycopg

    url = dbos_database_url()
    base = [str(python), "-P", str(DBOS_SCRIPT), "--database-url", url]
    done = subprocess.run([*base, "--reset"], cwd=common.ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"resetting DBOS's database failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    with psycopg.connect(url, autocommit=True) as conn:

        def succeeded() -> int:
            row = conn.execute("SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS' "
                               "AND workflow_uuid = ANY(%s)", [refs]).fetchone()
            return int(row[0]) if row else 0

        kills, seconds = supervise(
            lambda slot: Popened([*base, "--slot", str(slot), "--refs", ",".join(refs[slot::workers])], env,
                                 log_path),
            workers, succeeded, log_path,
        )
        lost = len(refs) - succeeded()
        if lost:  # say where DBOS left them
            rows = conn.execute(
                "SELECT status, executor_id, coalesce(queue_name, '-'), recovery_attempts, count(*) "
                "FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) AND status <> 'SUCCESS' "
                "GROUP BY 1, 2, 3, 4", [refs]).fetchall()
            print(f"  DBOS runs not finished ({lost}): (status, executor, queue, recovery attempts, runs) {rows}",
                  file=sys.stderr)
        return kills, seconds, lost


# --- variant 3: ours ----------------------------------------------------------------------


def run_ours(runs: int, workers: int, log_path: Path) -> tuple[int, float, int, list]:
    from bench.chaos import SETTLED, WorkerPool
    from sagas import start
    from sagas.models import WorkflowRun

    ids = [start("agent_order", {}).id for _ in range(runs)]
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
            elif time.monotonic() - moved > STALL_S:
                break
            time.sleep(0.1)
        seconds = time.monotonic() - began
        pool.reap()
    if pool.other_exits:
        raise SystemExit(f"workers exited other than by SIGKILL ({pool.other_exits[:3]}); see {log_path}")
    completed = WorkflowRun.objects.filter(id__in=ids, status="COMPLETED").count()
    return pool.kills, seconds, runs - completed, ids


# --- a cell -------------------------------------------------------------------------------


def run_cell(label: str, variant: str, chance: float, runs: int, workers: int, log_path: Path,
             python: Path | None) -> Cell:
    from bench.chaos import reset

    reset()  # the engine's tables, the bench Redis db and the providers' books
    os.environ["BENCH_CRASH_CHANCE"] = str(chance)  # forked children and the DBOS processes read it
    unknown = 0
    if variant == "plain":
        kills, seconds, lost = run_plain([f"plain-{chance:.2f}-{i}" for i in range(runs)], workers, log_path)
    elif variant == "dbos":
        assert python is not None
        kills, seconds, lost = run_dbos([f"dbos-{chance:.2f}-{i}" for i in range(runs)], workers, log_path,
                                        python, dict(os.environ))
    else:
        from ledger.models import EffectRecord

        kills, seconds, lost, ids = run_ours(runs, workers, log_path)
        unknown = EffectRecord.objects.filter(run_id__in=ids, status="UNKNOWN").count()
    cost, model_repeats, duplicates = common.provider_books()
    return Cell(label, variant, chance, runs, cost / runs, model_repeats, kills / runs, duplicates, unknown, lost,
                seconds)


# --- output -------------------------------------------------------------------------------


def print_table(cells: list[Cell], workers: int, left_out: dict[str, str] | None = None) -> None:
    """The cells' table; a variant in ``left_out`` (label -> why) gets a row saying so at each chance."""
    rows = [("variant", "crash chance", "model cost per run", "model turns billed again", "restarts per run",
             "duplicate tool executions", "effects UNKNOWN", "runs lost", "wall time")]
    for chance in sorted({c.chance for c in cells}):
        for label, variant in VARIANTS:
            for c in (c for c in cells if c.chance == chance and c.variant == variant):
                rows.append((c.label, f"{c.chance:.2f}", f"{c.cost_per_run:.2f}", str(c.model_repeats),
                             f"{c.restarts_per_run:.2f}", str(c.duplicates),
                             str(c.unknown) if c.variant == "ours" else "0 (none recorded)", str(c.lost),
                             f"{c.seconds:.0f} s"))
            if label in (left_out or {}):
                rows.append((label, f"{chance:.2f}", left_out[label], *("-",) * 6))
    common.print_table(
        f"Agents ({cells[0].runs} runs per cell, {workers} processes per variant, 4 model turns and 3 tools per run, "
        f"no crashes: cost {NO_CRASH_COST:.2f})", rows,
    )
    print("effects UNKNOWN: plain code and DBOS have no such state; a tool whose outcome is not known is "
          "simply run again (duplicate tool executions).")


def targets(cells: list[Cell]) -> list[str]:
    """What misses this benchmark's target (ours with no duplicate and no lost run, and a model
    cost no higher than DBOS's at the same crash chance): ours with a duplicate or a lost run, or
    a model cost above DBOS's at the same crash chance."""
    by = {(c.variant, c.chance): c for c in cells}
    missed = []
    for c in cells:
        if c.variant != "ours":
            continue
        if c.duplicates or c.lost:
            missed.append(f"ours at {c.chance:.2f}: {c.duplicates} duplicates, {c.lost} runs lost")
        dbos = by.get(("dbos", c.chance))
        # A run DBOS lost was not billed all its turns: its cost per run is then no yardstick.
        if dbos and not dbos.lost and c.cost_per_run > dbos.cost_per_run + 1e-9:
            missed.append(f"ours at {c.chance:.2f}: cost {c.cost_per_run:.2f} > DBOS's {dbos.cost_per_run:.2f}")
    return missed


def draw(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost_ax, dup_ax) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for label, variant in VARIANTS:
        points = sorted((c.chance, c.cost_per_run, c.duplicates) for c in cells if c.variant == variant)
        if not points:  # a variant left out (the smoke run without the DBOS environment)
            continue
        xs = [p[0] for p in points]
        cost_line, = cost_ax.plot(xs, [p[1] for p in points], marker="o", label=label)
        dup_line, = dup_ax.plot(xs, [p[2] for p in points], marker="o", label=label)
        below = variant == "ours"  # ours' labels under its line, DBOS's over it: they are 0.03 apart at 0.02
        for x, cost, dup in points:  # the figures, so DBOS's and ours read apart near the floor
            cost_ax.annotate(f"{cost:.2f}", (x, cost), textcoords="offset points", xytext=(4, -11 if below else 4),
                             fontsize=7, color=cost_line.get_color())
            dup_ax.annotate(str(dup), (x, dup), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=dup_line.get_color())
    cost_ax.axhline(NO_CRASH_COST, color="black", linewidth=0.6, linestyle=":", label="no crashes (8.0)")
    cost_ax.set_xlabel("crash chance per step")
    cost_ax.set_ylabel("model cost per run (billed at the gateway)")
    cost_ax.set_title("Model cost per run")
    dup_ax.set_xlabel("crash chance per step")
    dup_ax.set_yscale("symlog", linthresh=10)  # 0 stays 0; DBOS's tens and plain's thousands both show
    dup_ax.set_ylim(-1, max(10, max(c.duplicates for c in cells)) * 30)  # room for the legend above the lines
    dup_ax.set_ylabel(f"duplicate tool executions (of {3 * cells[0].runs} calls)")
    dup_ax.set_title("Tool calls executed again at the providers")
    for ax in (cost_ax, dup_ax):
        ax.grid(alpha=0.3)
        ax.margins(x=0.1)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"One pydantic-ai agent under real SIGKILLs ({cells[0].runs} runs per point)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="8 runs per variant at chance 0.20, for the test suite")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell (default 400; smoke 8)")
    parser.add_argument("--workers", type=int, default=4, help="processes per variant (default 4)")
    parser.add_argument("--chances", default=None, help="comma-separated crash chances (default 0.02,0.08,0.20)")
    parser.add_argument("--variants", default="plain,dbos,ours", help="comma-separated, of plain, dbos, ours")
    parser.add_argument("--png", type=Path, default=common.ROOT / "bench" / "figures" / "agents.png")
    args = parser.parse_args()
    runs = args.runs or (8 if args.smoke else 400)
    chances = [float(x) for x in (args.chances or ("0.20" if args.smoke else "0.02,0.08,0.20")).split(",")]
    variants = [(label, v) for label, v in VARIANTS if v in args.variants.split(",")]
    left_out: dict[str, str] = {}
    if args.smoke and any(v == "dbos" for _, v in variants) and not venv_ready():
        # The test suite runs the smoke run and installs nothing: DBOS's half is measured where
        # `make bench-env` (or a full run) made its virtualenv, and said to be missing elsewhere.
        from bench.dbos import MAKE_IT

        left_out = {label: f"not measured: no DBOS environment ({VENV.relative_to(common.ROOT)}), `{MAKE_IT}` "
                           "makes it" for label, v in variants if v == "dbos"}
        variants = [(label, v) for label, v in variants if v != "dbos"]

    python = ensure_venv() if any(v == "dbos" for _, v in variants) else None
    size = SIZES["smoke" if args.smoke else "full"]
    common.BENCH_DB = common.BENCH_DB.rsplit("/", 1)[0] + f"/{size['db']}"
    common.BENCH_REDIS = common.BENCH_REDIS.rsplit("/", 1)[0] + f"/{size['redis']}"
    common.setup_django(SAGAS_MODULES="bench.agents_workflows", SAGAS_LEASE_TTL=str(LEASE_TTL),
                        SAGAS_SWEEP_INTERVAL=str(SWEEP_INTERVAL), BENCH_CRASH_CHANCE="0")
    from django.conf import settings

    providers, url = common.start_providers(common.bench_env())
    settings.DEMO_PROVIDERS_URL = url  # forked workers inherit it
    os.environ["BENCH_PROVIDERS_URL"] = url  # the scripted model's gateway, in every variant
    log_path = Path(tempfile.mkstemp(prefix="agents-bench-", suffix=".log")[1])
    cells = []
    try:
        for chance in chances:
            for label, variant in variants:
                cells.append(run_cell(label, variant, chance, runs, args.workers, log_path, python))
                print(f"  {label} at {chance:.2f}: done in {cells[-1].seconds:.0f} s", file=sys.stderr)
    finally:
        providers.terminate()
        providers.wait(timeout=10)
    print_table(cells, args.workers, left_out)
    draw(cells, args.png)
    print(f"chart: {args.png}")
    if any(c.lost for c in cells):
        print(f"runs were lost: the processes' log is kept in {log_path}", file=sys.stderr)
    else:
        log_path.unlink()
    missed = targets(cells)
    print("Targets: met" if not missed else "Targets: MISSED: " + "; ".join(missed))
    if missed:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""DBOS Transact, measured beside our engine on the same PostgreSQL and the same workflow shape.

    .venv/bin/python bench/dbos.py --runs 250 --rounds 3

DBOS runs in its own virtualenv under ``.bench/dbos`` (its SQLAlchemy and psycopg
pins must not meet ours), made on first use from PyPI; bench/dbos_pure.py is the
script it runs there. Plain Python: importable without Django.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

ROOT = common.ROOT
VENV = ROOT / ".bench" / "dbos"
REQUIREMENT = "dbos==3.4.*"  # 3.4.0 is the newest 3.4 release on PyPI (2026-11-30)
SCRIPT = ROOT / "bench" / "dbos_pure.py"
STAMP = VENV / ".installed"
TIMEOUT_S = 900


def default_database_url() -> str:
    """``saga_bench_dbos`` on the server and as the user of BENCH_DB: DBOS drops and
    re-creates its database at each measurement, so it never shares ours."""
    parts = urlsplit(common.BENCH_DB)
    return urlunsplit(parts._replace(path="/saga_bench_dbos"))


MAKE_IT = "make bench-env"  # builds this virtualenv and bench/agents.py's (Makefile)


def venv_ready() -> bool:
    """Whether the DBOS virtualenv is there with this very requirement in (nothing is installed)."""
    return STAMP.exists() and STAMP.read_text() == REQUIREMENT and (VENV / "bin" / "python").exists()


def absent_reason() -> str:
    """What a smoke run prints where it leaves DBOS out because its virtualenv is absent."""
    return f"not measured: no DBOS environment ({VENV.relative_to(ROOT)}), `{MAKE_IT}` makes it"


def ensure_venv() -> Path:
    """The DBOS virtualenv's interpreter, creating the virtualenv and installing DBOS
    unless the stamp says this very requirement is already in.

    The virtualenv is made from the interpreter running this (the project's, so
    Python >= 3.11, which bench/dbos_pure.py needs for ``-P``)."""
    python = VENV / "bin" / "python"
    if venv_ready():
        return python
    if not python.exists():
        _run_or_exit([sys.executable, "-m", "venv", str(VENV)], "creating the DBOS virtualenv")
    _run_or_exit(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", REQUIREMENT],
        f"installing {REQUIREMENT}",
    )
    STAMP.write_text(REQUIREMENT)
    return python


def _run_or_exit(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def measure(runs: int, rounds: int, database_url: str | None = None) -> dict:
    """Run bench/dbos_pure.py in the DBOS virtualenv and return its JSON: ``dbos_version``,
    ``steps_per_s`` (one figure per round), ``runs``, ``steps_per_run`` and
    ``commits_per_step``.

    ``-P`` keeps bench/ off the script's import path, where our bench/dbos.py
    would shadow the ``dbos`` package."""
    python = ensure_venv()
    command = [
        str(python), "-P", str(SCRIPT),
        "--runs", str(runs), "--rounds", str(rounds),
        "--database-url", database_url or default_database_url(),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:  # its output comes as bytes, even with text=True
        tail = (exc.stderr or b"").decode(errors="replace")[-2000:]
        raise SystemExit(f"DBOS measurement still running after {TIMEOUT_S} s, killed: {tail}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"DBOS measurement failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=250, help="workflows per round, one at a time")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", help="DBOS's own database, dropped and re-created (default: %(default)s)",
                        default=default_database_url())
    args = parser.parse_args()
    result = measure(args.runs, args.rounds, args.database_url)
    common.print_table(
        f"DBOS Transact {result['dbos_version']} ({args.runs}x{result['steps_per_run']}-step workflows "
        f"one at a time, one process, rounds={args.rounds})",
        [
            ("figure", "value"),
            ("pure steps per second (median)", f"{common.median(result['steps_per_s']):.0f}"),
            ("pure steps per second, per round", ", ".join(f"{s:.0f}" for s in result["steps_per_s"])),
            ("commits per pure step", f"{result['commits_per_step']:.3f}"),
        ],
    )


if __name__ == "__main__":
    main()

"""What a ledgered effect costs compared with a pure step, on real workers and providers.

    .venv/bin/python bench/effects.py            # full sizes
    .venv/bin/python bench/effects.py --smoke    # tiny sizes (run by the test suite)

The providers (``manage.py demo_providers``) run as their own process on their
own database, so ``pg_stat_database.xact_commit`` of the engine's database
counts only the engine's commits. Per-run overhead (claim, finish) is
subtracted using the pure-step runs, so "commits per effect" is the marginal
cost of one effect.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

PROVIDER_DB = common.BENCH_DB.rsplit("/", 1)[0] + "/saga_bench_providers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_providers(port: int) -> subprocess.Popen:
    env = common.bench_env(DATABASE_URL=PROVIDER_DB)
    common.ensure_database(PROVIDER_DB)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=common.ROOT, env=env, check=True)
    return common.start_providers(env, port)[0]


def xact_commits() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return cur.fetchone()[0]


def measure(workflow: str, connector: str, runs: int, url: str) -> tuple[float, float]:
    """(seconds per run from first claim to last completion / runs, commits per run)."""
    from django.db import connection

    from sagas import start
    from sagas.models import WorkflowRun

    common.reset_state()
    with connection.cursor() as cur:
        cur.execute("TRUNCATE ledger_flowticket, ledger_effectrecord")  # a held call's ticket names its effect
    ids = [start(workflow, {"connector": connector}).id for _ in range(runs)]
    time.sleep(1.0)
    before = xact_commits()
    worker = common.spawn_worker("--burst", "--no-sweep", env=common.bench_env(DEMO_PROVIDERS_URL=url))
    worker.wait(timeout=600)
    time.sleep(1.5)
    after = xact_commits()
    done = WorkflowRun.objects.filter(id__in=ids, status="COMPLETED").count()
    if done != runs:
        raise SystemExit(f"{workflow}: only {done}/{runs} completed: {worker.stderr.read().decode()[-2000:]}")
    with connection.cursor() as cur:
        cur.execute(
            """SELECT extract(epoch FROM max(created_at) FILTER (WHERE kind = 'completed')
                                       - min(created_at) FILTER (WHERE kind = 'claimed'))
                 FROM sagas_journalentry"""
        )
        seconds = float(cur.fetchone()[0])
    return seconds / runs, (after - before - 2) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    common.setup_django()
    runs, rounds = (3, 1) if args.smoke else (40, 3)
    port = free_port()
    providers = start_providers(port)
    url = f"http://127.0.0.1:{port}"
    try:
        rows = {}
        for label, workflow, connector in (
            ("pure step", "bench_steps10", ""),
            ("effect, payments.capture (lookup + idempotent)", "bench_effects10", "payments.capture"),
            ("effect, email.send (neither)", "bench_effects10", "email.send"),
        ):
            samples = [measure(workflow, connector, runs, url) for _ in range(rounds)]
            rows[label] = (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))
    finally:
        providers.terminate()
        providers.wait(timeout=10)
    base_time, base_commits = rows["pure step"]
    per_run_overhead = base_commits - 10  # claim + finish (+ health check) per run
    table = [("operation", "ms each (median)", "commits each")]
    for label, (seconds, commits) in rows.items():
        table.append((label, f"{seconds / 10 * 1000:.2f}", f"{(commits - per_run_overhead) / 10:.2f}"))
    common.print_table(f"Effects vs pure steps (runs of 10, {runs} runs x {rounds} rounds, one worker)", table)
    print("target: 2 commits per effect (intent + outcome)")


if __name__ == "__main__":
    main()

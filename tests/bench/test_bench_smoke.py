"""The benchmarks are not part of the suite, but a tiny run of each is, so they cannot rot.

They use their own database (saga_bench) and Redis db 14, never the tests' or yours. Under
xdist they run in two groups that share no database, Redis db or virtualenv (tests/conftest.py).
"""

from __future__ import annotations

import re

import pytest

from bench.dbos import venv_ready as dbos_venv_ready
from tests.procs import BENCH_OWN, run_python


@pytest.mark.parametrize(
    ("script", "expected_rows"),
    [
        ("bench/engine.py", ["pure steps per second, one worker process", "commits per pure step (20-step",
                              "replay of a", "DBOS Transact 3.4", "ours / DBOS", "DBOS commits per pure step",
                              "dispatch latency", "recovery after SIGKILL", "1 worker process -> 2",
                              "pgbench, one client", "ours / pgbench commits", "dispatch beside one busy worker",
                              "concurrency 1, / pgbench one-client", "dispatch p95, idle worker, each of",
                              "dispatch p95 beside one busy worker", "continue_as_new loop"]),
        ("bench/effects.py", ["pure step", "payments.capture", "email.send"]),
        ("bench/console.py", ["run list, unfiltered", "run detail", "ambiguous-effects queue", "audit log, unfiltered",
                              "live update"]),
        pytest.param("bench/retention.py", ["runs archived per second", "worker steps/s, baseline", "worker steps/s, archiving",
                                "against the baseline before", "against the quiet windows between slices",
                                "run list requests not answered 200",
                                "archived runs with journal entries left", "archived runs without an ArchivedRun row",
                                "young and live runs changed", "journal rows removed"],
                     marks=pytest.mark.xdist_group(BENCH_OWN)),  # a private server, Redis 11
        ("bench/continue_loop.py", ["first 1,000 turns, median ms per turn", "last 1,000 turns, median ms per turn",
                                    "turn after a continuation", "longest journal of a run"]),
        ("bench/replay_check.py", ["runs checked per second", "check, ms per run", "replay (load + replay), ms per run",
                                   "check / replay"]),
        ("bench/schedules.py", ["ticks fired", "runs started (one per tick, none twice)",
                                "tick lateness p50 / p95 / max"]),
        pytest.param("bench/tracing.py", ["wall ms per run", "CPU ms per run (this process)"],
                     marks=pytest.mark.xdist_group(BENCH_OWN)),  # a private Redis, an OTLP receiver
        ("bench/partition.py", ["append statement, 1 client", "load_journal, one run (5",
                                "history page, long run, first", "retention: one month",
                                "retention: journal entries removed per second"]),
    ],
)
def test_it_runs_each_benchmark_at_tiny_size_and_prints_its_table(script, expected_rows):
    done = run_python([script, "--smoke"], timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    if script == "bench/engine.py" and not dbos_venv_ready():
        # The smoke run installs nothing: without the DBOS virtualenv its rounds are left out,
        # and the table says so and how to make it (`make bench-env`).
        [left_out] = [line for line in table if "DBOS Transact: pure steps per second, ours / DBOS" in line]
        assert "not measured: no DBOS environment" in left_out and "make bench-env" in left_out, left_out
        expected_rows = [row for row in expected_rows if "DBOS" not in row]
    for row in expected_rows:
        matches = [line for line in table if row in line]
        if len(matches) > 1:  # "ambiguous-effects queue" and its filtered variants: the row named exactly
            matches = [line for line in matches if line.split("|")[1].strip() == row]
        [line] = matches
        assert re.search(r"\|\s*[0-9.]+", line), line  # a measured number, not a placeholder


def test_the_chaos_benchmark_kills_workers_and_the_product_loses_nothing_and_repeats_nothing(tmp_path):
    chart = tmp_path / "chaos.png"
    done = run_python(["bench/chaos.py", "--smoke", "--png", str(chart)], timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and "0.20" in line}
    # columns: crash chance, model cost per run, model calls repeated, restarts per run, duplicates, runs lost, ...
    product, restart = rows["journal + ledger and keys"], rows["restart from scratch"]
    assert float(restart[3]) > 0 and float(product[3]) > 0, "no worker was killed: the smoke run proved nothing"
    assert product[4] == "0" and product[5] == "0"
    assert float(product[1]) == 8.0  # no model call billed twice
    assert float(restart[1]) > 8.0
    assert chart.stat().st_size > 10_000 and chart.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.xdist_group(BENCH_OWN)  # private servers, and saga_bench_faults_providers
def test_it_soaks_the_engine_in_faults_without_a_duplicate_a_lost_run_or_a_wrong_failure():
    """bench/faults.py --smoke: 40 order runs on private PostgreSQL and Redis servers through a
    worker SIGKILL, a PostgreSQL restart, a pg_terminate_backend round, a Redis restart and a
    provider timeout; it exits 1 when a target is missed."""
    done = run_python(["bench/faults.py", "--smoke"], timeout=600)
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    figures = {line.split("|")[1].strip(): line.split("|")[2].strip()
               for line in done.stdout.splitlines() if line.startswith("| ")}
    injected = {kind: int(figures[kind]) for kind in (
        "worker SIGKILL (process group)", "PostgreSQL restart (-m fast)", "pg_terminate_backend round",
        "Redis restart", "provider timeout (after the work)")}
    assert all(n >= 1 for n in injected.values()), injected  # every fault really happened
    assert figures["runs COMPLETED"] == "38 of 38", output
    assert figures["runs COMPENSATED by design"] == "2 of 2", output
    for zero in ("runs FAILED wrongly (or ended other than designed)", "runs stuck without an attention item",
                 "runs lost (not started, or missing)", "effects left IN_PROGRESS",
                 "duplicate executions at the providers", "runs whose provider books disagree with their end"):
        assert figures[zero] == "0", (zero, output)
    assert int(figures["effects settled by a provider lookup"]) >= 1  # the timed-out effect was reconciled
    assert float(figures["seconds from the end of the last fault until everything settled"]) <= 60
    assert "Targets: met" in done.stdout


@pytest.mark.xdist_group(BENCH_OWN)  # saga_bench_bulk_smoke and Redis 11
def test_it_runs_the_bulk_benchmark_small_with_an_audit_entry_per_item_and_live_progress():
    """bench/bulk.py --smoke: a batch of 200 UNKNOWN effects resolved and one of 200 runs
    cancelled by a real worker process (about 20 s here)."""
    done = run_python(["bench/bulk.py", "--smoke"], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and "batch" not in line}
    # columns: items, acted on, refused, items/s, wall time, preview, audit entries written, live pushes, polled
    for label in ("resolve UNKNOWN effects", "cancel WAITING runs"):
        items, acted, refused, rate, _, _, audited, pushes, polled = rows[label]
        assert (items, acted, refused, audited) == ("200", "200", "0", "201"), rows[label]
        assert float(rate) > 0 and int(pushes) >= 2 and int(polled) >= 2, rows[label]


@pytest.mark.xdist_group(BENCH_OWN)  # saga_bench_children_smoke and a private Redis server
def test_it_fans_out_children_and_gathers_them_and_prints_the_table():
    """bench/children.py --smoke: one parent starts 20 children on 2 real worker processes and
    gathers them, against 20 plain runs of the same workflow (about 25 s here). The figures mean
    little at this size; the parent completing with every child's result, and each row measured,
    is what a smoke run can say. The script exits 1 when a run did not complete."""
    done = run_python(["bench/children.py", "--smoke"], timeout=300)
    output = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| -")}
    assert rows["rounds whose parent COMPLETED with its 20 children's results"] == ["1 of 1"] * 3, output
    for label in ("fan-out of 20 children + gather: parent start() to COMPLETED, s",
                  "20 plain runs: first start() to last COMPLETED, s", "fan-out time / plain time",
                  "commits per child (whole round)", "commits per plain run (whole round)",
                  "commits a child costs beyond a plain run (less idle)", "parent claims (attempts)",
                  "parent function executions (first + replays, all claims)", "parent journal entries (last_seq)",
                  "gather tail: last child finished to parent COMPLETED, s",
                  "idle workers: commits per second (one round, no run)"):
        assert re.fullmatch(r"-?[\d,.]+", rows[label][1]), (label, output)  # a measured number
    assert float(rows["commits per child (whole round)"][1]) > 1, output
    assert int(rows["parent claims (attempts)"][1]) >= 1, output
    # started, a claim, 20 child_started, 20 child_finished, children_joined, completed at least
    assert int(rows["parent journal entries (last_seq)"][1]) >= 44, output

"""bench/api.py --smoke: starts through the API against start() in-process, and the long-poll.

It uses its own database (saga_bench_api_smoke) and Redis db 1, never the tests' or a full
run's. About 10 s. The targets themselves (API adds < 5 ms; long-poll p95 < 100 ms) are the
full run's business (bench/README.md): here a loaded CI machine only has to stay in bounds
a user would still call prompt."""

from __future__ import annotations

import re

import pytest

from tests.procs import BENCH_OWN, run_python


@pytest.mark.xdist_group(BENCH_OWN)  # saga_bench_api_smoke and Redis 1
def test_it_starts_runs_through_the_api_and_answers_every_long_poll_soon_after_the_run_finished():
    done = run_python(["bench/api.py", "--smoke"], timeout=120)
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output  # a long-poll that timed out or answered other than COMPLETED exits 1
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ")}
    per_second = rows["starts per second, 8 clients x 10"]
    assert float(per_second[0].rstrip("/s")) > 0 and float(per_second[2].rstrip("/s")) > 0, per_second
    p95 = rows["long-poll, finished_at to answer: p95"][2]
    assert float(p95.removesuffix(" ms")) < 1000, p95  # woken by NOTIFY, not by a 30 s timeout
    one = rows["one start, 1 client, p50 (30 starts)"]
    assert all(re.fullmatch(r"[\d.]+ ms", cell) for cell in one[:3]), one
    assert "Targets:" in done.stdout

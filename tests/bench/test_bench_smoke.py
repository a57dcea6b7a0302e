"""The benchmarks are not part of the suite, but a tiny run of each is, so they cannot rot.

They use their own database (saga_bench) and Redis db 14, never the tests' or yours.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.procs import ROOT


@pytest.mark.parametrize(
    ("script", "expected_rows"),
    [
        ("bench/engine.py", ["pure steps per second", "commits per pure step", "replay of a"]),
        ("bench/effects.py", ["pure step", "payments.capture", "email.send"]),
        ("bench/console.py", ["run list, unfiltered", "run detail", "ambiguous-effects queue", "audit log, unfiltered",
                              "live update"]),
    ],
)
def test_it_runs_each_benchmark_at_tiny_size_and_prints_its_table(script, expected_rows):
    done = subprocess.run(
        [sys.executable, script, "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    for row in expected_rows:
        [line] = [line for line in table if row in line]
        assert re.search(r"\|\s*[0-9.]+", line), line  # a measured number, not a placeholder

"""ruff and mypy, configured in pyproject.toml, pass on this checkout.

They run here, as subprocesses from the repository root, so that ``make test`` runs them
beside the rest of the suite on its xdist workers. ``ruff check .`` covers every Python file
(tests and benchmarks too); mypy checks the product packages listed under ``[tool.mypy]``.
Both keep their caches in the repository (.ruff_cache/, .mypy_cache/, ignored by git):
a warm mypy run takes seconds, a cold one most of a minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # The suite's settings (config.settings_test) take a test-session slot when imported; the
    # type checker's plugin imports the settings named in [tool.django-stubs] instead.
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_ruff_check_passes():
    result = _run("ruff", "check", ".", "--no-fix", "--output-format", "concise")
    assert result.returncode == 0, f"ruff check . failed:\n{result.stdout}{result.stderr}"


def test_mypy_passes():
    result = _run("mypy")
    assert result.returncode == 0, f"mypy failed:\n{result.stdout}{result.stderr}"

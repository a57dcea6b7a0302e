"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
page missing from the navigation, and every name the Python API reference asks mkdocstrings
for resolves through the public packages (``sagas``, ``ledger``) and is rendered from its
docstring."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_with_the_api_reference_from_docstrings(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr

    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "python-api" / "index.html").read_text()))
    text = " ".join(page.split())
    import sagas

    first_line = " ".join(sagas.start.__doc__.split("\n\n")[0].split()).replace("``", "")
    assert first_line in text, "the reference does not show sagas.start's docstring"
    for name in ("sagas.start", "sagas.Context", "ledger.resolve", "ledger.Connector"):
        assert f'id="{name}"' in (site / "reference" / "python-api" / "index.html").read_text(), name


def test_the_reference_names_only_the_public_packages():
    """Submodules are internal: the reference asks for ``sagas.X`` and ``ledger.X`` only."""
    import ledger
    import sagas

    text = (ROOT / "docs" / "reference" / "python-api.md").read_text()
    names = re.findall(r"^::: ([\w.]+)", text, flags=re.M)
    assert names
    for name in names:
        package, _, attr = name.partition(".")
        assert package in ("sagas", "ledger") and "." not in attr, name
        assert attr in {"sagas": sagas, "ledger": ledger}[package].__all__, name

"""Every code block in README.md and docs/ that claims to run is run, as pasted.

The convention (also in docs/contributing.md), for fenced blocks whose language is one
of python, sh, bash, shell or console:

* ```` ```python title="myflows.py" ````: a **file**. The page's files are written, under
  their title (a relative path), into a fresh directory before the page's commands run.
* ``<!-- run -->`` on the line before a ```` ```sh ```` block: **commands**, run with
  ``bash -e`` in that directory, one block after another in page order. The directory
  links ``manage.py`` and ``.venv`` to the repository's and is on ``PYTHONPATH``, so it
  behaves as the repository root the page tells the reader to save the files in.
* ``<!-- output -->`` on the line before a ```` ```text ```` block right after a run
  block: what the reader sees. Each of its lines must be a line of the commands' standard
  output, in that order (other lines, such as a worker's banner, may come between).
* ``<!-- not run -->`` on the line before any other block of those languages: an
  **illustration** (a fragment, a sketch with ``...``, a command for a production
  server). It is never run, and says so explicitly.

A block of those languages with none of these markers fails
``test_every_block_says_whether_it_runs``. Other languages (text, json, yaml, ...)
are data and never run.

README.md's and the docs pages' commands run against the product's settings
(``config.settings``), as they tell a reader to. All on the test database, with this session's Redis database. After each run every run in the database must be
COMPLETED.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings

from tests import procs

ROOT = Path(__file__).resolve().parents[2]
CODE_LANGUAGES = {"python", "py", "sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
TITLE = re.compile(r'title="([^"]+)"')


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass
class Block:
    page: Path
    line: int  # 1-based, the opening fence
    language: str
    info: str
    marker: str  # "run", "output", "not run", or "" when the line before is no marker
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def title(self) -> str | None:
        found = TITLE.search(self.info)
        return found.group(1) if found else None


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i].strip())
        if not opening or lines[i] != lines[i].lstrip():
            i += 1
            continue
        fence, info = opening.group("fence"), opening.group("info").strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = re.fullmatch(r"<!--\s*(run|output|not run)\b.*-->", before)
        found.append(Block(page, i + 1, (info.split() or [""])[0].lower(), info,
                           marker.group(1) if marker else "", "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


@dataclass
class Scenario:
    page: Path
    files: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[Block, Block | None]] = field(default_factory=list)  # (commands, expected output)


def scenario(page: Path) -> Scenario:
    found = blocks(page)
    plan = Scenario(page)
    for n, block in enumerate(found):
        if block.language in ("python", "py") and block.title and block.marker != "not run":
            plan.files[block.title] = block.code
        elif block.marker == "run":
            after = found[n + 1] if n + 1 < len(found) and found[n + 1].marker == "output" else None
            plan.steps.append((block, after))
    return plan


RUNNABLE = [p for p in pages() if scenario(p).steps]


def test_every_block_says_whether_it_runs():
    unmarked, wrong = [], []
    for page in pages():
        for block in blocks(page):
            if block.language not in CODE_LANGUAGES:
                if block.marker == "run":
                    wrong.append(f"{block.where}: <!-- run --> on a ```{block.language} block")
                continue
            if block.marker == "run" and block.language not in ("sh", "bash"):
                wrong.append(f"{block.where}: only sh/bash blocks are run; a file needs title=")
            elif block.marker == "output":
                wrong.append(f"{block.where}: <!-- output --> goes on a ```text block")
            elif not block.marker and not (block.language in ("python", "py") and block.title):
                unmarked.append(block.where)
    assert not unmarked, "blocks that neither run nor say they do not (add <!-- not run -->): " + ", ".join(unmarked)
    assert not wrong, "; ".join(wrong)


def test_the_readme_has_one_example_that_runs():
    plan = scenario(ROOT / "README.md")
    assert list(plan.files) == ["myflows.py"]
    assert plan.steps and all(expected for _, expected in plan.steps), "the README's commands say what they print"
    assert ROOT / "README.md" in RUNNABLE


def test_every_page_with_files_runs_them():
    for page in pages():
        plan = scenario(page)
        assert not plan.files or plan.steps, f"{page.relative_to(ROOT)} has files and no <!-- run --> block"


# What the README and the docs tell a reader to run: the product's settings. (The README's
# example also ran with the demo app installed while config/settings.py still installed it.)
SETTINGS = {"product": ("config.settings", False)}


def environment(workdir: Path, settings_module: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAGAS_", "DJANGO_", "PYTHON")) and k not in ("DEBUG", "DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE=settings_module, DEBUG="1", DATABASE_URL=procs.test_database_url(),
               REDIS_URL=settings.REDIS_URL, PYTHONPATH=str(workdir), PYTHONUNBUFFERED="1")
    return env


def workspace(tmp_path: Path, plan: Scenario) -> Path:
    workdir = tmp_path / "repo"
    workdir.mkdir()
    (workdir / "manage.py").symlink_to(ROOT / "manage.py")
    (workdir / ".venv").symlink_to(Path(sys.executable).resolve().parents[1] if not (ROOT / ".venv").exists()
                                   else ROOT / ".venv")
    for name, code in plan.files.items():
        assert not Path(name).is_absolute() and ".." not in Path(name).parts, name
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(code)
    return workdir


def in_order(expected: list[str], seen: list[str]) -> bool:
    rest = iter(seen)
    return all(any(line == got for got in rest) for line in expected)


CASES = [pytest.param(page, variant, id=f"{page.relative_to(ROOT)}-{variant}")
         for page in RUNNABLE for variant in SETTINGS]


@pytest.mark.parametrize(("page", "variant"), CASES)
def test_the_page_runs_as_pasted(page, variant, tmp_path, transactional_db):
    from sagas.models import RunStatus, WorkflowRun

    settings_module, with_demo = SETTINGS[variant]
    plan = scenario(page)
    workdir = workspace(tmp_path, plan)
    env = environment(workdir, settings_module)
    for commands, expected in plan.steps:
        done = subprocess.run(["bash", "-e", "-c", commands.code], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, f"{commands.where} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        if expected:
            want = [line.rstrip() for line in expected.code.splitlines() if line.strip()]
            got = [line.rstrip() for line in done.stdout.splitlines()]
            assert in_order(want, got), (f"{commands.where} should print (as {expected.where} says):\n"
                                         + "\n".join(want) + "\nbut printed:\n" + done.stdout + done.stderr)
    runs = list(WorkflowRun.objects.values_list("workflow_name", "status"))
    assert runs and all(status == RunStatus.COMPLETED for _, status in runs), runs

    # The settings the commands ran under: the product without the demo app, or with it.
    probe = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c",
         "from django.apps import apps; print(apps.is_installed('demo'))"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[-1] == str(with_demo), (
        f"{settings_module} should {'' if with_demo else 'not '}install the demo app")

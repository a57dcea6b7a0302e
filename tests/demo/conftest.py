"""Fixtures running ``manage.py demo`` (see ``tests.demo.demoproc``); every process is killed afterwards."""

from __future__ import annotations

import pytest

from tests.demo.demoproc import Demo


@pytest.fixture
def demos(tmp_path, request):
    """``demos(name)``: a new ``Demo`` whose run directory is the test's one run directory."""
    made: list[Demo] = []

    def make(name: str = "demo") -> Demo:
        made.append(Demo(tmp_path, name, tmp_path / "run"))
        return made[-1]

    yield make
    for demo in made:
        demo.kill_everything()  # whatever a failed test left running
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for demo in made:
            demo.report()
        for log in sorted((tmp_path / "run").glob("*.log")):
            print(f"----- {log.name} -----\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def demo(demos):
    return demos("demo")

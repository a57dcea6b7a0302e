"""The replay check (``sagas.replay_check``, ``manage.py sagas_replay_check``): the recorded
journals of real runs replayed against code that is deployed or not, executing nothing and
writing nothing; compatible, divergent (with the source line) and failing code told apart, and
an exit status a deploy pipeline can gate on."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from sagas import replay_check, start
from sagas.errors import WorkflowNotRegistered
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.testing import run_until_idle
from sagas.versions import registry
from tests.sagas.replay_code import orders_v1  # noqa: F401  (deploys version 1 in this process)

pytestmark = pytest.mark.django_db(transaction=True)
CODE = Path(__file__).parent / "replay_code"


def waiting_runs(n: int) -> list[WorkflowRun]:
    runs = [start("rc_order", {"id": f"o-{i}"}, business_key=f"o-{i}") for i in range(n)]
    for run in runs:
        assert run_until_idle(run.id).status == RunStatus.WAITING
    return runs


def journal_size() -> int:
    return JournalEntry.objects.count()


def test_the_fixed_code_replays_every_run_in_flight_and_nothing_is_executed_or_written():
    runs = waiting_runs(3)
    before = journal_size()
    report = replay_check("rc_order", module=str(CODE / "orders_v2_fixed.py"))

    assert report.version == 2 and report.module.endswith("orders_v2_fixed.py")
    assert report.counts == {"compatible": 3, "diverges": 0, "error": 0} and report.ok
    assert {r.run_id for r in report.runs} == {str(r.id) for r in runs}
    assert {r.ended for r in report.runs} == {"waits"}  # each replays to its timer, where it waits
    assert journal_size() == before  # nothing was written
    assert registry.find("rc_order", 2) is None  # and the checked code was not deployed by checking it


def test_a_renamed_step_is_reported_with_its_position_both_sides_and_the_source_line():
    [run] = waiting_runs(1)
    report = replay_check("rc_order", module=str(CODE / "orders_v2_renamed.py"))

    [checked] = report.runs
    assert checked.outcome == "diverges" and not report.ok
    price = JournalEntry.objects.get(run=run, kind="step", name="price")
    assert checked.position == price.seq
    assert checked.journal == {"seq": price.seq, "kind": "step", "name": "price"}
    assert checked.code_asked == {"kind": "step", "name": "quote"}
    assert checked.source["text"] == 'ctx.step("quote", lambda: 100)  # was "price"'
    assert checked.source["file"].endswith("orders_v2_renamed.py")


def test_the_command_prints_a_table_or_json_and_exits_1_on_divergence(capsys):
    waiting_runs(2)
    out = io.StringIO()
    call_command("sagas_replay_check", "rc_order", "--module", str(CODE / "orders_v2_fixed.py"), stdout=out)
    assert "2 run(s) checked" in out.getvalue() and "2 compatible, 0 diverge, 0 error(s)" in out.getvalue()

    out = io.StringIO()
    with pytest.raises(SystemExit) as stopped:
        call_command("sagas_replay_check", "rc_order", "--module", str(CODE / "orders_v2_renamed.py"), "--json",
                     stdout=out)
    assert stopped.value.code == 1
    printed = json.loads(out.getvalue())
    assert printed["counts"] == {"compatible": 0, "diverges": 2, "error": 0}
    assert {r["code_asked"]["name"] for r in printed["runs"]} == {"quote"}


def test_the_deployed_version_replays_its_own_runs_and_unknown_code_is_a_clear_error():
    waiting_runs(1)
    assert replay_check("rc_order", version=1).ok  # today's code against its own runs
    with pytest.raises(WorkflowNotRegistered):
        replay_check("rc_order", version=7)
    with pytest.raises(WorkflowNotRegistered, match="defines no workflow 'rc_order'"):
        replay_check("rc_order", module="tests.sagas.replay_code.__init__")
    from django.core.management.base import CommandError
    with pytest.raises(CommandError, match="no such file"):
        call_command("sagas_replay_check", "rc_order", "--module", "/nowhere/orders.py")


def test_a_deploy_pipeline_gates_on_the_command_s_exit_status():
    """As a pipeline runs it: a separate process on the same database, the code not deployed."""
    import subprocess

    from tests.procs import run_python, worker_env

    waiting_runs(2)
    root = Path(__file__).resolve().parents[2]
    env = worker_env("tests.sagas.replay_code.orders_v1")

    def check(module: str) -> subprocess.CompletedProcess:
        return run_python(["manage.py", "sagas_replay_check", "rc_order", "--module", str(CODE / module)],
                          cwd=root, env=env, timeout=120)

    passed = check("orders_v2_fixed.py")
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert "2 compatible, 0 diverge, 0 error(s)" in passed.stdout
    refused = check("orders_v2_renamed.py")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "0 compatible, 2 diverge" in refused.stdout and "orders_v2_renamed.py" in refused.stdout

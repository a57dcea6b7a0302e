"""``manage.py demo`` as a user runs it: a real subprocess starting real processes, against the
tests' PostgreSQL database and Redis database (never the developer's), stopped by a real SIGINT."""

from __future__ import annotations

import os
import re
import signal

import pytest

from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas.models import ApprovalRequest, ApprovalState, RunStatus, WorkflowRun
from tests.demo.demoproc import http_status
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_the_quick_demo_to_its_summary(demo):
    proc = demo.start("--quick", "--runs", "5")
    code = proc.wait(timeout=180)
    out = demo.output()
    assert code == 0, out
    summary = r"summary: 5/5 runs COMPLETED in [\d.]+s; \d+ steps journaled; .*; 0 step\(s\) journaled twice"
    assert re.search(summary, out), out
    assert WorkflowRun.objects.filter(workflow_name="order_fulfilment", status=RunStatus.COMPLETED).count() == 5


def test_it_runs_the_product_demo_with_faults_approvals_and_kills_and_sigint_stops_every_process(demo):
    proc = demo.start("--port", "0", "--kill-every", "10", "--duration", "300")  # a cap: the test stops it first
    found = wait_until(
        lambda: re.search(r"Saga Console: (http://\S+)", demo.output()) or proc.poll() is not None, 90,
        what="the demo to print the console's URL",
    )
    assert proc.poll() is None, demo.output()
    url = found.group(1)
    assert http_status(url + "login/") in (200, 302)
    users = (demo.run_dir / "demo-users.txt").read_text()
    for username in ("operator", "approver", "auditor"):
        password = re.search(rf"^{username} \w+ (\S+)$", users, re.M).group(1)
        assert f"log in as {username}" in demo.output() and password in demo.output()

    agents = WorkflowRun.objects.filter(workflow_name="order_agent")

    # Each has been seen at some moment: an UNKNOWN effect is settled by the reconciler within
    # seconds, so on a loaded machine it may be gone before the first approval waits.
    checks = {
        "a completed run": lambda: agents.filter(status=RunStatus.COMPLETED).exists(),
        "a compensated run": lambda: agents.filter(status=RunStatus.COMPENSATED).exists(),
        "an UNKNOWN effect": lambda: EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).exists(),
        "a pending approval": lambda: ApprovalRequest.objects.filter(state=ApprovalState.PENDING).exists(),
        "a worker kill": lambda: "** SIGKILL worker-" in demo.output(),
    }
    seen: set[str] = set()

    def everything_shown() -> bool:
        seen.update(name for name, check in checks.items() if name not in seen and check())
        return len(seen) == len(checks)

    try:
        wait_until(everything_shown, 120, interval=0.5, what="completed and compensated runs, an UNKNOWN "
                   "effect, a pending approval and a worker kill, each at some moment")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; never seen: {sorted(set(checks) - seen)}\n{demo.output()[-3000:]}") from exc
    # The workers go on completing runs through the kills: after one more SIGKILL (one every
    # 10 s) an agent run completes that had not completed before it. (This slept until 40 s had
    # passed; it now waits for the kill itself, then for the next completion.)
    kills = demo.output().count("** SIGKILL worker-")
    wait_until(lambda: demo.output().count("** SIGKILL worker-") > kills, 60, interval=0.5,
               what="one more worker kill")
    completed_after_kills = agents.filter(status=RunStatus.COMPLETED).count()
    wait_until(lambda: agents.filter(status=RunStatus.COMPLETED).count() > completed_after_kills, 60, interval=0.5,
               what=f"an agent run to complete after the first {completed_after_kills}, through the kills")
    assert proc.poll() is None, demo.output()
    out = demo.output()  # the status lines counted what the database shows
    assert re.search(r"runs: .*\d+ COMPLETED", out) and re.search(r"\| unknown effects: [1-9]", out), out[-3000:]
    assert re.search(r"\| pending approvals: [1-9]", out), out[-3000:]
    assert "keeps exiting" not in demo.output()
    # Every approval the bot decided is in the audit log, by the named system actor (read in that
    # order: the entry commits with the decision, so none read first can be missing).
    by_bot = {str(i) for i in
              ApprovalRequest.objects.filter(decided_by_label="demo-bot").values_list("id", flat=True)}
    audited = set(AuditEntry.objects.filter(actor_label="system: approver-bot", action="approval.approve",
                                            outcome="ok").values_list("object_id", flat=True))
    assert by_bot and by_bot <= audited

    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 0, demo.output()
    assert "SIGINT: stopping every process the demo started" in demo.output()
    pids = demo.child_pids()
    assert len(pids) >= 7  # providers, daphne, 2 workers, sweeper, reconciler, at least one restart
    for pgid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def test_it_stops_by_itself_after_duration_and_a_restart_prints_the_same_logins_and_stops_on_sigterm(demo):
    proc = demo.start("--port", "0", "--kill-every", "0", "--duration", "6")
    assert proc.wait(timeout=120) == 0, demo.output()
    first = demo.output()
    assert "--duration 6s reached" in first
    first_pids = demo.child_pids()
    assert len(first_pids) == 6
    for pgid in first_pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    logins = re.findall(r"log in as .*", first)
    assert len(logins) == 3

    # Restarted in the same run directory (its logs are appended to): same logins, and new
    # orders complete, so the workers reach this run's providers, not the last one's.
    before = WorkflowRun.objects.filter(workflow_name="order_agent", status=RunStatus.COMPLETED).count()
    demo.out_path.write_text("")
    proc = demo.start("--port", "0", "--kill-every", "0", "--duration", "120")
    wait_until(lambda: "Saga Console:" in demo.output() or proc.poll() is not None, 90, what="the restarted demo")
    assert re.findall(r"log in as .*", demo.output()) == logins
    wait_until(
        lambda: WorkflowRun.objects.filter(workflow_name="order_agent", status=RunStatus.COMPLETED).count() > before,
        60, interval=0.5, what="the restarted demo to complete a run",
    )
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, demo.output()
    assert "SIGTERM: stopping every process the demo started" in demo.output()
    for pgid in demo.child_pids():
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)

"""``manage.py demo`` as a user runs it: a real subprocess starting real processes, against the
tests' PostgreSQL database and Redis database (never the developer's), through real SIGKILLs
and a real ``pg_terminate_backend``, stopped by a real SIGINT or SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import pytest
from django.db import connection
from django.utils import timezone

from demo.models import WebhookArrival
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas.models import ApprovalRequest, ApprovalState, RunStatus, WorkflowRun
from tests.demo.demoproc import http_status, pg_client_ports, providers_urls, running
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


def test_it_runs_the_product_demo_through_kills_provider_and_database_faults_and_sigint_stops_every_process(demo):
    """One product demo, watched as a user would, through every fault it is shown to survive:
    its own worker kills, a SIGKILL of its providers, two terminations of its database
    connection; then a SIGINT stops every process it started. One demo and not four: each start
    is seven Django processes, and the suite is held to ten minutes on two cores."""
    proc = demo.start("--port", "0", "--kill-every", "10", "--duration", "600")  # a cap: the test stops it first
    wait_until(lambda: "arrive at" in demo.output() or proc.poll() is not None, 90,
               what="the demo to print the console's and the webhook receiver's addresses")
    assert proc.poll() is None, demo.output()
    url = demo.url()
    assert http_status(url + "login/") in (200, 302)
    users = (demo.run_dir / "demo-users.txt").read_text()
    for username in ("operator", "approver", "auditor"):
        password = re.search(rf"^{username} \w+ (\S+)$", users, re.M).group(1)
        assert f"log in as {username}" in demo.output() and password in demo.output()
    receiver = re.search(r"arrive at (http://\S+/webhook/)", demo.output())
    assert receiver, demo.output()

    agents = WorkflowRun.objects.filter(workflow_name="order_agent")

    # Each has been seen at some moment: an UNKNOWN effect is settled by the reconciler within
    # seconds, so on a loaded machine it may be gone before the first approval waits.
    checks = {
        "a completed run": lambda: agents.filter(status=RunStatus.COMPLETED).exists(),
        "a compensated run": lambda: agents.filter(status=RunStatus.COMPENSATED).exists(),
        "an UNKNOWN effect": lambda: EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).exists(),
        "an UNKNOWN effect notified to the demo's receiver": lambda: WebhookArrival.objects.filter(
            kind="unknown_effect").exists(),
        "a pending approval": lambda: ApprovalRequest.objects.filter(state=ApprovalState.PENDING).exists(),
        "a worker kill": lambda: "** SIGKILL worker-" in demo.output(),
    }
    seen: set[str] = set()

    def everything_shown() -> bool:
        seen.update(name for name, check in checks.items() if name not in seen and check())
        return len(seen) == len(checks)

    try:
        wait_until(everything_shown, 120, interval=0.5, what="completed and compensated runs, an UNKNOWN "
                   "effect and its notification, a pending approval and a worker kill, each at some moment")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; never seen: {sorted(set(checks) - seen)}\n{demo.output()[-3000:]}") from exc

    # The notification: signed, delivered once, shown on the receiver's page.
    arrival = WebhookArrival.objects.filter(kind="unknown_effect").order_by("id").first()
    effect = EffectRecord.objects.get(id=int(arrival.body["item"].removeprefix("effect:")))
    print(f"UNKNOWN effect {effect.id} ({effect.connector}) -> the demo receiver "
          f"{(arrival.received_at - effect.intent_at).total_seconds():.2f} s after its intent")
    assert arrival.signature_ok
    assert WebhookArrival.objects.filter(body__item=arrival.body["item"]).count() == 1
    page = urllib.request.urlopen(receiver.group(1), timeout=10).read().decode()
    assert "signature ok" in page and "UNKNOWN effect" in page

    # The workers go on completing runs through the kills: after one more SIGKILL (one every
    # 10 s) an agent run completes that had not completed before it.
    kills = demo.output().count("** SIGKILL worker-")
    wait_until(lambda: demo.output().count("** SIGKILL worker-") > kills, 60, interval=0.5,
               what="one more worker kill")
    completed_after_kills = agents.filter(status=RunStatus.COMPLETED).count()
    wait_until(lambda: agents.filter(status=RunStatus.COMPLETED).count() > completed_after_kills, 60, interval=0.5,
               what=f"an agent run to complete after the first {completed_after_kills}, through the kills")
    out = demo.output()  # the status lines counted what the database shows
    # (An UNKNOWN effect is open only until the reconciler asks its provider, often less than the
    # 10 s between two status lines: the line's count of open ones may well be 0 at each.)
    assert re.search(r"runs: .*\d+ COMPLETED", out) and re.search(r"\| unknown effects: \d+ \|", out), out[-3000:]
    assert re.search(r"\| pending approvals: [1-9]", out), out[-3000:]

    # The providers are SIGKILLed: the demo restarts them on the same address, and orders
    # started from then on complete (the fault table makes some compensate or wait for a person).
    [address] = providers_urls(demo)
    os.killpg(demo.started()["providers"], signal.SIGKILL)
    restarted = wait_until(lambda: re.search(r"providers exited with status -9; restarted as pid (\d+)",
                                             demo.output()), 30, interval=0.2, what="the demo to restart the providers")
    wait_until(lambda: len(providers_urls(demo)) == 2, 60, interval=0.2, what="the restarted providers to listen")
    assert providers_urls(demo) == [address, address]
    assert running(int(restarted.group(1)))
    restarted_at = timezone.now()
    wait_until(lambda: agents.filter(created_at__gt=restarted_at, status=RunStatus.COMPLETED).exists(), 120,
               interval=0.5, what="an order started after the providers' restart to complete")

    # Its own database connection is terminated, twice: it logs one line when each outage starts
    # and one when it ends, and goes on starting orders.
    db_port = int(connection.settings_dict["PORT"] or 5432)
    for outage in (1, 2):
        ports = wait_until(lambda: pg_client_ports(demo.popen.pid, db_port), 30, interval=0.2,
                           what="the demo's own connection to PostgreSQL")
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND client_port = ANY(%s)", [list(ports)])
            assert [ok for (ok,) in cur.fetchall()] == [True] * len(ports)
        terminated_at = timezone.now()
        wait_until(lambda: agents.filter(created_at__gt=terminated_at).count() >= 2, 90, interval=0.5,
                   what=f"orders started after the demo's connection was terminated ({outage})")
        out = demo.output()
        assert out.count("storage outage: PostgreSQL unreachable while starting the demo's orders") == outage, out
        assert len(re.findall(r"storage outage over: PostgreSQL answers again after [\d.]+ s", out)) == outage, out
        assert proc.poll() is None, out

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
    assert len(pids) >= 8  # providers, daphne, 2 workers, sweeper, reconciler, the providers' restart, a worker's
    for pgid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def test_it_stops_by_itself_after_duration_and_leaves_no_process_behind(demo):
    """Its restart in the same run directory (same logins, orders completing on the new
    providers, stopped by SIGTERM) is watched after a SIGKILL in ``test_demo_processes.py``."""
    proc = demo.start("--port", "0", "--kill-every", "0", "--duration", "6")
    assert proc.wait(timeout=120) == 0, demo.output()
    first = demo.output()
    assert "--duration 6s reached" in first
    first_pids = demo.child_pids()
    assert len(first_pids) == 6
    for pgid in first_pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    assert len(re.findall(r"log in as .*", first)) == 3

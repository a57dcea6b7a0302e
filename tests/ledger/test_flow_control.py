"""Flow control with real worker processes: limits that hold across processes and threads, a
429 storm that opens the circuit without making anything UNKNOWN, a paused connector that holds
only its own calls (and loses none to a Redis flush), and fairness between tenants.

The simulated providers count what really reached them: ``ProviderExecution`` rows (one per real
execution, with its time), and for an operation with a provider-side limit
(``demo.providers.limits``) the 429s it answered and the most requests it served at once.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import timedelta

import pytest

from demo.providers import limits
from demo.providers.faults import inject
from demo.providers.selectors import executions
from ledger.flow import services
from ledger.flow.selectors import run_waiting_for
from ledger.flow.services import Limits
from ledger.models import CircuitChange, ConnectorFlow, EffectRecord, EffectStatus, SpendDay
from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.runtime.queue import redis_connection
from tests.ledger import wf_orders  # noqa: F401
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def flows(stack):
    services.sync_declared()  # what a worker does at start-up; the tests then change limits live
    return stack


def set_limits(connector: str, **changes) -> None:
    flow = ConnectorFlow.objects.get(connector=connector)
    services.connector_limits_set(connector=connector, by="ops",
                                  limits=Limits(**{**Limits.of(flow).as_dict(), **changes}))


def most_in_one_second(times: list) -> int:
    """The most of ``times`` (datetimes) that fall in any window of one second."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= timedelta(seconds=1):
            first += 1
        most = max(most, last - first + 1)
    return most


def all_settled(ids: list, timeout: float) -> Counter:
    wait_until(lambda: not WorkflowRun.objects.filter(id__in=ids).exclude(
        status__in=(RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)).exists(),
        timeout=timeout, interval=0.2, what="every run settled")
    return Counter(WorkflowRun.objects.filter(id__in=ids).values_list("status", flat=True))


def test_rate_and_concurrency_limits_hold_across_two_worker_processes_of_eight_threads(flows):
    """The limiter counts a call when it is marked sent, the provider when it arrives: a call
    whose thread is slow between the two (a loaded machine) can arrive next to the one after it.
    So the connector is set one call a second below the provider's limit, as the guide says to;
    at the provider's own rate, beside the whole suite, 9 once arrived within a second."""
    set_limits("email.send", rate=7.0, burst=1, max_in_flight=3)
    limits.limit("email", "send", 8)  # the provider refuses (429) a ninth request in any second
    inject("email", "send", "latency:0.3", times=1000)  # each call takes a while: slots matter
    ids = [start("email_only", {"id": f"lim-{i:02d}"}).id for i in range(40)]
    began = time.monotonic()
    flows.worker("a", "--concurrency", "8")
    flows.worker("b", "--concurrency", "8")

    assert all_settled(ids, timeout=90) == {RunStatus.COMPLETED: 40}
    took = time.monotonic() - began
    sent = list(executions("email", "send").values_list("created_at", flat=True))
    assert len(sent) == 40
    # Where the limiter counts (the dispatch marks, across both processes): 7/s and a burst of 1.
    marks = list(EffectRecord.objects.filter(connector="email.send").values_list("dispatched_at", flat=True))
    assert len(marks) == 40 and most_in_one_second(marks) <= 8
    assert most_in_one_second(sent) <= 8
    assert limits.refused("email", "send") == 0, "the provider had to refuse calls over its limit"
    assert 1 <= limits.peak_in_flight("email", "send") <= 3
    # 16 threads would have sent all 40 in about a second; the limit spread them over 5.
    assert took >= 39 / 7


def test_a_storm_of_429s_opens_the_circuit_and_no_call_becomes_unknown(flows):
    set_limits("email.send", circuit_failures=3, circuit_cooldown_seconds=1.0)
    limits.limit("email", "send", 2)
    ids = [start("email_only", {"id": f"storm-{i:02d}"}).id for i in range(30)]
    flows.worker("a", "--concurrency", "8")
    flows.worker("b", "--concurrency", "8")

    assert all_settled(ids, timeout=120) == {RunStatus.COMPLETED: 30}
    assert not EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).exists()
    assert not JournalEntry.objects.filter(run_id__in=ids, kind="halted").exists()
    per_key = Counter(executions("email", "send").values_list("idempotency_key", flat=True))
    assert len(per_key) == 30 and set(per_key.values()) == {1}
    changes = list(CircuitChange.objects.filter(connector="email.send").order_by("at", "id"))
    states = [c.state for c in changes]
    assert states[0] == "open" and states[-1] == "closed", states
    assert "429" in changes[0].error
    # While the circuit was open nothing was sent: a call already out when it opened may land
    # just after, then nothing until the trial (half-open).
    sent = list(executions("email", "send").values_list("created_at", flat=True))
    for opened, after in zip(changes, changes[1:], strict=False):
        if opened.state == "open":
            quiet = [at for at in sent if opened.at + timedelta(seconds=0.5) < at < after.at]
            assert quiet == [], (opened, after, quiet)


def test_a_paused_connector_holds_only_its_calls_and_a_redis_flush_loses_none(flows):
    services.connector_pause(connector="email.send", by="ops", reason="the mail relay is down")
    mails = [start("email_only", {"id": f"held-{i}"}).id for i in range(5)]
    captures = [start("capture_only", {"id": f"go-{i}"}).id for i in range(5)]
    flows.worker("a", "--concurrency", "4")

    assert all_settled(captures, timeout=60) == {RunStatus.COMPLETED: 5}
    wait_until(lambda: WorkflowRun.objects.filter(id__in=mails, status=RunStatus.WAITING).count() == 5,
               timeout=30, what="the mail runs waiting")
    assert executions("email", "send").count() == 0
    assert set(EffectRecord.objects.filter(run_id__in=mails).values_list("status", flat=True)) == {
        EffectStatus.PENDING}
    held = sorted(run_waiting_for(run_id).describe() for run_id in mails)
    assert held == [f"waiting for email.send (connector paused, position {n})" for n in range(1, 6)]

    redis_connection().flushdb()  # every queued wake-up gone; the tickets are in PostgreSQL
    services.connector_resume(connector="email.send", by="ops", reason="relay back")
    assert all_settled(mails, timeout=60) == {RunStatus.COMPLETED: 5}
    assert sorted(executions("email", "send").values_list("request__subject", flat=True)) == [
        f"held-{i}" for i in range(5)]


def test_one_tenants_backlog_does_not_starve_another_tenants_runs(flows):
    set_limits("email.send", rate=6.0, burst=1)
    backlog = [start("email_only", {"id": f"acme-{i:02d}"}, tenant="acme").id for i in range(30)]
    flows.worker("a", "--concurrency", "4")
    wait_until(lambda: executions("email", "send").count() >= 3, timeout=30, what="the backlog under way")
    late = [start("email_only", {"id": f"globex-{i}"}, tenant="globex").id for i in range(4)]

    assert all_settled(backlog + late, timeout=90) == {RunStatus.COMPLETED: 34}
    order = list(executions("email", "send").values_list("request__subject", flat=True))
    # Each newcomer took its place next to the head of the queue when it was held, whenever its
    # run got there. (Not its place among the sends: a loaded machine claims a newcomer's run
    # late, after most of the backlog went out, and the send order then says nothing about the
    # queue; the suite saw the last newcomer sent 26th of 34.) The k-th of them (0-based) has the
    # backlog's next k + 1 calls and its own k before it, at most position 2k + 2 = 8, where
    # queueing behind the backlog would have put it behind every acme call still waiting.
    held_at = [int(re.search(r"position (\d+)", reason).group(1)) for reason in JournalEntry.objects.filter(
        run_id__in=late, kind="suspended").order_by("run_id", "seq").distinct("run_id").values_list(
        "payload__reason", flat=True)]
    assert held_at and max(held_at) <= 2 * len(late), (held_at, order)


def test_a_tenant_over_its_daily_spend_limit_parks_its_run_until_the_limit_is_raised(flows):
    services.spend_limit_set(tenant="acme", connector="model.complete", per_day=1.0, by="ops")
    run = start("priced_calls", {"id": "spend", "calls": 5, "price": 0.4}, tenant="acme")
    other = start("priced_calls", {"id": "other", "calls": 5, "price": 0.4}, tenant="globex")
    flows.worker("a", "--concurrency", "2")

    # 0.4, 0.8, then 1.2 (checked before it went out, at 0.8): the fourth call finds the day
    # spent and does not go out.
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.NEEDS_ATTENTION, timeout=60,
               what="the run parked at its tenant's spend limit")
    parked = WorkflowRun.objects.get(id=run.id)
    assert parked.status_reason == "spend_limit"
    assert parked.error["connector"] == "model.complete" and parked.error["tenant"] == "acme"
    assert (parked.error["spent"], parked.error["limit"]) == (pytest.approx(1.2), 1.0)
    assert "spent 1.2000 of its 1.0000 usd limit on model.complete" in parked.error["message"]
    assert executions("model", "complete").filter(request__prompt__startswith="spend").count() == 3
    # Another tenant has no limit: its run went on.
    assert all_settled([other.id], timeout=60) == {RunStatus.COMPLETED: 1}

    services.spend_limit_set(tenant="acme", connector="model.complete", per_day=2.0, by="ops")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, timeout=60,
               what="the sweeper resuming the run under the raised limit")
    prompts = Counter(executions("model", "complete").filter(request__prompt__startswith="spend")
                      .values_list("request__prompt", flat=True))
    assert len(prompts) == 5 and set(prompts.values()) == {1}
    done = WorkflowRun.objects.get(id=run.id)
    assert float(done.cost_used) == pytest.approx(2.0)
    assert float(SpendDay.objects.get(tenant="acme", connector="model.complete").spent) == pytest.approx(2.0)


def test_calls_let_go_are_taken_ahead_of_a_backlog_of_runs_not_yet_started(flows):
    """A run whose held call was let go has capacity at its provider waiting for it (which lapses
    unused): its worker takes it next, not after every run started since it was held."""
    services.connector_pause(connector="email.send", by="ops", reason="the mail relay is down")
    inject("payments", "capture", "latency:0.25", times=1000)  # each run's first call takes a while
    early = [start("order3", {"id": f"early-{i}"}).id for i in range(3)]
    flows.worker("a", "--concurrency", "1")  # one thread: it takes one run at a time, in queue order
    wait_until(lambda: WorkflowRun.objects.filter(id__in=early, status=RunStatus.WAITING).count() == 3,
               timeout=30, what="the early runs held at their email")
    backlog = [start("order3", {"id": f"late-{i:02d}"}).id for i in range(12)]
    wait_until(lambda: executions("payments", "capture").count() >= 3 + 2, timeout=30,
               what="the backlog under way")
    services.connector_resume(connector="email.send", by="ops", reason="relay back")

    assert all_settled(early + backlog, timeout=90) == {RunStatus.COMPLETED: 15}
    captured = {row.request["order"]: row.created_at for row in executions("payments", "capture")}
    last_early_mail = max(row.created_at for row in executions("email", "send")
                          if row.request["subject"].startswith("Order early-"))
    backlog_first = sorted(at for order, at in captured.items() if order.startswith("late-"))
    before = sum(at < last_early_mail for at in backlog_first)
    # Behind the backlog the early mails would go after all 12 late captures; taken first, they
    # go within a run or two of the resume (2 or 3 late captures done by then).
    assert before <= 6, f"{before} of the backlog's captures went before the early runs' mails"

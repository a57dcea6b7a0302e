"""Flow control at the ledger's protocol, without a workflow: the gate in front of every dispatch,
the pump that lets held calls go, and the circuit breaker's count. ``ListJournal`` stands in for
a run (tests/ledger/test_protocol.py); the effect records, the flow tables and the simulated
providers (a real HTTP process with its own books) are real. The same rules with real worker
processes are in test_flow_control.py."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from demo.providers import limits
from demo.providers.faults import inject
from demo.providers.selectors import executions
from ledger.flow import pump, services
from ledger.flow.services import InvalidFlowSetting, Limits
from ledger.models import CircuitChange, ConnectorFlow, EffectRecord, EffectStatus, FlowBucket, FlowTicket
from ledger.protocol import run_effect
from tests.ledger.test_protocol import CAPTURE, EMAIL, Held, ListJournal

pytestmark = pytest.mark.django_db(transaction=True)


def limits_of(connector: str, **changes) -> Limits:
    flow = ConnectorFlow.objects.get(connector=connector)
    return Limits(**{**Limits.of(flow).as_dict(), **changes})


@pytest.fixture
def flows(stack):
    """Every registered connector's flow row, as a worker writes them at start-up."""
    services.sync_declared()
    return stack


def held(journal: ListJournal, name: str, connector: str, payload: dict) -> Held:
    with pytest.raises(Held) as caught:
        run_effect(journal, name=name, connector_name=connector, payload=payload)
    return caught.value


def test_a_paused_connector_holds_its_calls_unsent_and_lets_them_go_once_resumed(flows):
    services.connector_pause(connector="email.send", by="ops", reason="the mail relay is down")
    first, second = ListJournal(), ListJournal()
    hold = held(first, "mail", "email.send", EMAIL)
    assert hold.hold.describe() == "waiting for email.send (connector paused, position 1)"
    assert held(second, "mail", "email.send", {**EMAIL, "to": "bob@example.com"}).hold.position == 2
    # Other connectors go on.
    run_effect(ListJournal(), name="pay", connector_name="payments.capture", payload=CAPTURE)
    assert executions("email", "send").count() == 0 and executions("payments", "capture").count() == 1
    # Never sent, so never UNKNOWN: PENDING, with its place in the queue.
    assert set(EffectRecord.objects.filter(connector="email.send").values_list("status", flat=True)) == {
        EffectStatus.PENDING}
    assert pump.pump() == 0, "a paused connector's calls were let go"

    services.connector_resume(connector="email.send", by="ops", reason="relay back")
    assert pump.pump() == 2
    assert set(FlowTicket.objects.values_list("state", flat=True)) == {"granted"}
    for journal in (first, second):  # the runs come back (a replay) and send, once each
        run_effect(journal.recover(), name="mail", connector_name="email.send",
                   payload=EMAIL if journal is first else {**EMAIL, "to": "bob@example.com"})
    assert executions("email", "send").count() == 2
    assert not FlowTicket.objects.exists()


def test_a_concurrency_limit_holds_the_call_past_it_until_a_slot_frees(flows):
    services.connector_limits_set(connector="payments.capture", by="ops",
                                  limits=limits_of("payments.capture", max_in_flight=1))
    # A call out right now (dispatched, no answer yet) takes the one slot.
    out = EffectRecord.objects.create(
        tenant="t-protocol", idempotency_key="busy", run_id="00000000-0000-0000-0000-000000000001",
        step_name="pay", connector="payments.capture", request_payload={}, payload_hash="x",
        status=EffectStatus.IN_PROGRESS, attempts=1, dispatched_at=timezone.now(), intent_at=timezone.now())
    journal = ListJournal()
    assert held(journal, "pay", "payments.capture", CAPTURE).hold.describe() == \
        "waiting for payments.capture (concurrency limit, position 1)"
    assert record_status(journal) == EffectStatus.PENDING  # a lookup connector's intent is not marked sent
    assert pump.pump() == 0
    EffectRecord.objects.filter(id=out.id).update(status=EffectStatus.SUCCEEDED)
    assert pump.pump() == 1
    run_effect(journal.recover(), name="pay", connector_name="payments.capture", payload=CAPTURE)
    assert executions("payments", "capture").count() == 1


def record_status(journal: ListJournal) -> str:
    return EffectRecord.objects.get(run_id=journal.run_id).status


def test_the_rate_limit_lets_a_burst_go_then_holds_the_rest_in_order(flows):
    services.connector_limits_set(connector="email.send", by="ops",
                                  limits=limits_of("email.send", rate=0.5, burst=2))
    journals = [ListJournal() for _ in range(4)]
    for i, journal in enumerate(journals[:2]):
        run_effect(journal, name="mail", connector_name="email.send", payload={**EMAIL, "to": f"{i}@x.org"})
    positions = [held(j, "mail", "email.send", {**EMAIL, "to": f"{i + 2}@x.org"}).hold.position
                 for i, j in enumerate(journals[2:])]
    assert positions == [1, 2]
    assert executions("email", "send").count() == 2
    # Nothing more for 2 s (0.5 calls/s): the pump lets none go yet.
    assert pump.pump() == 0


def test_the_pump_lets_calls_go_at_the_rate_while_those_let_go_are_still_on_their_way(flows):
    """A call let go takes a while to reach its dispatch (a wake-up, a claim, a replay). At 50/s
    the pump lets 13 go at once (a quarter second's tokens), then keeps letting them go at the
    rate: counting the ones still on their way against the next tokens capped a burst at 35 to
    41/s. The rate itself is held where calls leave (the gate), and what is on its way is bounded."""
    services.connector_pause(connector="email.send", by="ops", reason="hold to build a queue")
    for i in range(130):
        held(ListJournal(), "mail", "email.send", {**EMAIL, "to": f"q{i}@x.org"})
    services.connector_limits_set(connector="email.send", by="ops",
                                  limits=limits_of("email.send", rate=50.0, burst=1))
    services.connector_resume(connector="email.send", by="ops", reason="relay back")
    began = time.monotonic()
    pump.pump()
    assert FlowTicket.objects.filter(state="granted").count() == 13

    def the_rate_allows() -> int:  # since the first pass began: its 13, then 50 a second
        return 13 + math.ceil(50 * (time.monotonic() - began))

    # The next quarter second's tokens are spoken for: a second pass at once lets go only what the
    # rate has made since (none to 2 on a quiet machine; the bound follows a slow one's clock).
    second = pump.pump()
    assert 13 + second <= the_rate_allows()
    time.sleep(0.5)  # none of them has reached its dispatch yet
    # Whatever is still on its way, the pump keeps letting calls go at the rate: at least the
    # quarter second's tokens of the half second slept, never more than the clock allows.
    third = pump.pump()
    assert third >= 10
    assert FlowTicket.objects.filter(state="granted").count() <= the_rate_allows()
    for _ in range(6):
        time.sleep(0.5)
        pump.pump()
    # At most two seconds of the rate (101) on their way, however many wait.
    assert FlowTicket.objects.filter(state="granted").count() == 101
    assert executions("email", "send").count() == 0


def test_one_tenants_backlog_does_not_starve_another_tenant(flows):
    services.connector_pause(connector="email.send", by="ops", reason="hold to build a queue")
    backlog = []
    for i in range(6):
        journal = ListJournal()
        journal.tenant = "acme"
        held(journal, "mail", "email.send", {**EMAIL, "to": f"a{i}@x.org"})
        backlog.append(journal)
    late = ListJournal()
    late.tenant = "globex"
    held(late, "mail", "email.send", EMAIL)
    # Oldest first within a tenant, and the newcomer takes turns with the backlog rather than
    # queueing behind all of it.
    order = list(FlowTicket.objects.order_by("tag", "id").values_list("lane", flat=True))
    assert order.index("globex") <= 1, order
    assert [t for t in order if t == "acme"] == ["acme"] * 6


def test_retryable_failures_open_the_circuit_and_calls_wait_unsent_until_a_trial_closes_it(flows):
    services.connector_limits_set(connector="email.send", by="ops", limits=limits_of(
        "email.send", circuit_failures=2, circuit_cooldown_seconds=30))
    fault = inject("email", "send", "error_before_work", times=2)
    first = ListJournal()
    # Two 503s in a row open the circuit; the retry that would have been the third call waits.
    assert held(first, "mail", "email.send", EMAIL).hold.describe() == \
        "waiting for email.send (circuit open, position 1)"
    fault.refresh_from_db()
    assert fault.remaining == 0
    late = ListJournal()
    assert held(late, "mail", "email.send", {**EMAIL, "to": "late@x.org"}).hold.position == 2
    assert executions("email", "send").count() == 0
    assert set(EffectRecord.objects.values_list("status", flat=True)) == {EffectStatus.PENDING}  # not UNKNOWN
    assert pump.pump() == 0, "calls were let go before the cool-down"

    FlowBucket.objects.update(opened_at=timezone.now() - timedelta(seconds=30))  # the cool-down has passed
    assert pump.pump() == 1  # the trial: the oldest held call, alone
    assert FlowBucket.objects.get(connector="email.send").circuit == "half_open"
    run_effect(first.recover(), name="mail", connector_name="email.send", payload=EMAIL)
    assert FlowBucket.objects.get(connector="email.send").circuit == "closed"
    assert list(CircuitChange.objects.order_by("id").values_list("state", flat=True)) == [
        "open", "half_open", "closed"]
    assert pump.pump() == 1
    run_effect(late.recover(), name="mail", connector_name="email.send", payload={**EMAIL, "to": "late@x.org"})
    assert executions("email", "send").count() == 2


def test_the_providers_429_is_retried_without_using_up_attempts(flows):
    limits.limit("email", "send", 1)
    run_effect(ListJournal(), name="mail", connector_name="email.send", payload=EMAIL)
    journal = ListJournal()
    # The provider refuses the second call within its second (429, Retry-After: 1); it is sent
    # again after a second and goes through, and the refusal cost no attempt.
    result = run_effect(journal, name="mail", connector_name="email.send", payload={**EMAIL, "to": "b@x.org"})
    assert result["message_id"]
    assert limits.refused("email", "send") == 1
    effect = EffectRecord.objects.get(run_id=journal.run_id)
    assert (effect.status, effect.attempts) == (EffectStatus.SUCCEEDED, 2)


def test_limits_refuse_nonsense_and_change_nothing(flows):
    before = Limits.of(ConnectorFlow.objects.get(connector="email.send"))
    for bad, says in (({"rate": -1.0}, "rate"), ({"rate": float("nan")}, "number"), ({"burst": 0}, "burst"),
                      ({"max_in_flight": 2.5}, "whole"), ({"key_field": "<script>"}, "limit key")):
        with pytest.raises(InvalidFlowSetting, match=says):
            services.connector_limits_set(connector="email.send", by="ops", limits=limits_of("email.send", **bad))
    assert Limits.of(ConnectorFlow.objects.get(connector="email.send")) == before

"""The simulated providers as a real HTTP process, driven through the real demo connectors.

The providers' own tables are the evidence: what executed, how often, and what
was only replayed.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import demo.connectors  # noqa: F401  (registers the connectors in this process)
from demo import client
from demo.models import ProviderFault
from demo.providers import faults
from demo.providers.selectors import duplicate_keys, executions, replays
from ledger import Final, NotExecuted, Retryable, Succeeded, Timeout, Unknown
from ledger.connectors import get_connector
from tests.procs import start_providers, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = {"order": "order-1842", "amount_cents": 4999, "currency": "EUR"}


@pytest.fixture
def providers(providers_url) -> str:
    """The session's real ``demo_providers`` process (tests/conftest.py), its books emptied; the
    connectors in this process point at it."""
    return providers_url


@pytest.fixture
def own_providers(procs, settings) -> str:
    """A ``demo_providers`` process of this test's own, for a test that stops it."""
    url = start_providers(procs)
    settings.DEMO_PROVIDERS_URL = url
    return url


def capture():
    return get_connector("payments.capture")


def test_it_captures_a_payment_once_per_key_and_replays_the_first_answer(providers):
    first = capture().execute(ORDER, key="cap-1")
    again = capture().execute(ORDER, key="cap-1")
    other = capture().execute(ORDER, key="cap-2")

    assert first["status"] == "captured" and first["amount_cents"] == 4999
    assert again == first
    assert other["transaction_id"] != first["transaction_id"]
    assert executions("payments", "capture", "cap-1").count() == 1
    assert replays("payments", "capture", "cap-1").count() == 1
    assert list(duplicate_keys("payments", "capture")) == []
    row = executions("payments", "capture", "cap-1").get()
    assert row.request == ORDER and row.response == first and row.status_code == 201


def test_it_executes_a_key_once_under_concurrent_retries(providers):
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: capture().execute(ORDER, key="cap-race"), range(8)))

    assert len({r["transaction_id"] for r in results}) == 1
    assert executions("payments", "capture", "cap-race").count() == 1
    assert replays("payments", "capture", "cap-race").count() == 7


def test_it_refuses_a_key_reused_with_a_different_amount(providers):
    first = capture().execute(ORDER, key="cap-1")

    with pytest.raises(Final, match="already used with a different request body"):
        capture().execute({**ORDER, "amount_cents": 5999}, key="cap-1")

    assert list(executions("payments", "capture").values_list("response", flat=True)) == [first]
    assert replays("payments", "capture").count() == 0


def test_it_answers_a_status_query_before_and_after_a_capture(providers):
    assert capture().lookup("cap-1") == NotExecuted()

    result = capture().execute(ORDER, key="cap-1")

    assert capture().lookup("cap-1") == Succeeded(result, result["transaction_id"])
    assert capture().lookup("cap-other") == NotExecuted()
    # Keys are path segments: slashes and colons must round-trip.
    odd = capture().execute(ORDER, key="run/42:capture#2")
    assert capture().lookup("run/42:capture#2") == Succeeded(odd, odd["transaction_id"])
    # A status query that fails says nothing either way.
    faults.inject("payments", "status", "error_before_work")
    outcome = capture().lookup("cap-1")
    assert isinstance(outcome, Unknown) and "503" in outcome.reason


def test_it_refunds_a_capture_once_per_key_and_refuses_unknown_transactions(providers):
    result = capture().execute(ORDER, key="cap-1")

    refund = capture().compensate(ORDER, result, key="cap-1:compensate")
    again = capture().compensate(ORDER, result, key="cap-1:compensate")

    assert refund == again and refund["refund_id"].startswith("re_")
    assert executions("payments", "refund").count() == 1
    with pytest.raises(Final, match="exceeds what is left"):
        capture().compensate(ORDER, result, key="cap-1:compensate-again")
    with pytest.raises(Final, match="unknown transaction"):
        capture().compensate(ORDER, {"transaction_id": "txn_nope", "amount_cents": 1}, key="refund-nope")
    assert executions("payments", "refund").count() == 1


def test_it_reserves_stock_again_on_every_call_and_releases_it(providers):
    reserve = get_connector("inventory.reserve")
    assert reserve.lookup("rsv-1") == NotExecuted()

    first = reserve.execute({"sku": "SKU-1", "qty": 2}, key="rsv-1")
    second = reserve.execute({"sku": "SKU-1", "qty": 2}, key="rsv-1")

    assert first["reservation_id"] != second["reservation_id"]
    assert executions("inventory", "reserve", "rsv-1").count() == 2
    assert list(duplicate_keys("inventory", "reserve")) == ["rsv-1"]
    assert reserve.lookup("rsv-1") == Succeeded(first, first["reservation_id"])

    released = reserve.compensate({}, first, key="rsv-1:compensate")
    assert released == {"released": True, "reservation_id": first["reservation_id"], "already_released": False}
    assert reserve.compensate({}, first, key="rsv-1:compensate")["already_released"] is True
    with pytest.raises(Final, match="unknown reservation"):
        reserve.compensate({}, {"reservation_id": "rsv_nope"}, key="x")


def test_it_sends_an_email_on_every_call(providers):
    send = get_connector("email.send")
    message = {"to": "ada@example.com", "subject": "Order shipped", "body": "It is on its way."}

    first = send.execute(message, key="mail-1")
    second = send.execute(message, key="mail-1")

    assert first["message_id"] != second["message_id"]
    assert executions("email", "send").count() == 2
    assert list(duplicate_keys("email", "send")) == ["mail-1"]
    assert not send.can_lookup() and not send.idempotent and not send.can_compensate()
    assert client.send("GET", "/email/status/mail-1").status == 404


def test_it_creates_a_shipment_once_per_key_and_offers_no_cancel(providers):
    ship = get_connector("shipping.create")
    body = {"order": "order-1842", "address": {"city": "Lyon"}}
    assert ship.lookup("shp-1") == NotExecuted()

    first = ship.execute(body, key="shp-1")

    assert ship.execute(body, key="shp-1") == first
    assert executions("shipping", "create").count() == 1
    assert ship.lookup("shp-1") == Succeeded(first, first["shipment_id"])
    assert ship.irreversible and not ship.can_compensate()
    with pytest.raises(Final, match="no endpoint"):
        client.call("POST", "/shipping/cancel", {"shipment_id": first["shipment_id"]}, key="c")


def test_it_bills_every_model_call_without_a_key_and_answers_a_keyed_repeat_from_its_cache(providers):
    prompt = {"prompt": "plan order-1842 <b>now</b>", "price": 2.0}

    plain = [client.call("POST", "/model/complete", prompt) for _ in range(2)]
    model = get_connector("model.complete")
    keyed = model.execute(prompt, key="run-1:plan")

    assert model.execute(prompt, key="run-1:plan") == keyed  # a retry after a crash is not billed again
    assert plain[0]["completion_id"] != plain[1]["completion_id"]
    billed = executions("model", "complete")
    assert billed.count() == 3
    assert sum(e.response["cost"] for e in billed) == 6.0
    assert replays("model", "complete", key="run-1:plan").count() == 1
    assert model.idempotent and not model.can_lookup() and not model.can_compensate()
    with pytest.raises(Final, match="'price' must be a positive number"):
        model.execute({"prompt": "x", "price": "free"}, key="run-1:bad")
    assert executions("model", "complete").count() == 3


def test_it_raises_timeout_when_the_provider_acts_but_answers_too_late(providers, settings):
    settings.DEMO_PROVIDER_TIMEOUT = 0.5
    faults.inject("payments", "capture", "timeout_after_work")

    with pytest.raises(Timeout):  # the client gave up after its 0.5 s; the provider sleeps 10 s before answering
        capture().execute(ORDER, key="cap-slow")

    # The charge happened: the status query proves it, and a retry with the key replays it (with
    # the usual timeout: on a loaded machine the replay's answer once took over the 0.5 s).
    settings.DEMO_PROVIDER_TIMEOUT = 5
    row = executions("payments", "capture", "cap-slow").get()
    assert capture().lookup("cap-slow") == Succeeded(row.response, row.response["transaction_id"])
    assert capture().execute(ORDER, key="cap-slow") == row.response
    assert executions("payments", "capture", "cap-slow").count() == 1


def test_it_raises_retryable_when_the_provider_fails_before_work(providers):
    faults.inject("payments", "capture", "error_before_work")

    with pytest.raises(Retryable, match="503"):
        capture().execute(ORDER, key="cap-1")
    assert executions("payments").count() == 0

    result = capture().execute(ORDER, key="cap-1")  # the same key, retried
    assert executions("payments", "capture", "cap-1").get().response == result


def test_it_raises_final_when_the_provider_refuses_before_work(providers):
    faults.inject("email", "send", "final")

    with pytest.raises(Final, match="injected fault final"):
        get_connector("email.send").execute({"to": "a@example.com", "subject": "s", "body": "b"}, key="m")
    assert executions("email").count() == 0


CALLER = """
import django
django.setup()
import demo.connectors
from ledger.connectors import get_connector
print("calling the provider", flush=True)
get_connector("payments.capture").execute({"order": "o-kill", "amount_cents": 700, "currency": "EUR"}, key="cap-kill")
print("the caller survived", flush=True)
"""


def test_it_kills_the_caller_after_the_work_is_committed(providers, procs):
    faults.inject("payments", "capture", "kill_caller_after_work")

    caller = procs.start("caller", ["-c", CALLER], worker_env("", DEMO_PROVIDERS_URL=providers))
    returncode = caller.popen.wait(timeout=30)

    assert returncode == -signal.SIGKILL, caller.log()
    assert "calling the provider" in caller.log() and "survived" not in caller.log()
    row = executions("payments", "capture", "cap-kill").get()
    assert row.caller_pid == caller.pid
    assert capture().lookup("cap-kill") == Succeeded(row.response, row.response["transaction_id"])


def test_it_applies_an_injected_fault_exactly_times_times(providers):
    faults.inject("payments", "capture", "error_before_work", times=2)

    outcomes = []
    for i in range(4):
        try:
            outcomes.append(capture().execute({**ORDER, "order": f"o-{i}"}, key=f"cap-{i}")["status"])
        except Retryable:
            outcomes.append("retryable")

    assert outcomes == ["retryable", "retryable", "captured", "captured"]
    assert executions("payments", "capture").count() == 2
    assert ProviderFault.objects.get().remaining == 0
    # A fault targets one (provider, operation): captures do not spend a refund's fault.
    refund_fault = faults.inject("payments", "refund", "final", times=1)
    capture().execute(ORDER, key="cap-after")
    refund_fault.refresh_from_db()
    assert refund_fault.remaining == 1
    faults.clear()
    assert ProviderFault.objects.count() == 0


def test_it_applies_a_fault_named_in_the_x_fault_header(providers):
    began = time.monotonic()
    result = client.call("POST", "/payments/capture", ORDER, key="cap-1", headers={"X-Fault": "latency:0.4"})
    assert time.monotonic() - began >= 0.4
    assert result["status"] == "captured"

    with pytest.raises(Final, match="injected fault final"):
        client.call("POST", "/payments/capture", ORDER, key="cap-2", headers={"X-Fault": "final"})
    with pytest.raises(Final, match="unknown fault"):
        client.call("POST", "/payments/capture", ORDER, key="cap-3", headers={"X-Fault": "explode"})
    assert list(executions("payments").values_list("idempotency_key", flat=True)) == ["cap-1"]
    with pytest.raises(ValueError, match="unknown fault"):
        faults.inject("payments", "capture", "explode")


def test_it_refuses_malformed_requests_without_executing(providers):
    with pytest.raises(Final, match="Idempotency-Key header is required"):
        client.call("POST", "/payments/capture", ORDER)
    with pytest.raises(Final, match="'amount_cents' must be a positive integer"):
        capture().execute({**ORDER, "amount_cents": "12"}, key="cap-1")
    with pytest.raises(Final, match="not an email address"):
        get_connector("email.send").execute({"to": "nobody", "subject": "s", "body": "b"}, key="")
    assert client.send("GET", "/nowhere").status == 404
    assert client.send("GET", "/payments/capture").status == 405
    assert client.send("DELETE", "/shipping/create").body == {"error": "/shipping/create takes POST"}
    bad_json = urllib.request.Request(
        providers + "/payments/capture", data=b"{not json", method="POST", headers={"Idempotency-Key": "k"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad_json, timeout=5)
    assert refused.value.code == 400 and b"not valid JSON" in refused.value.read()
    assert executions("payments").count() == executions("email").count() == 0


def test_it_reports_an_unreachable_provider_as_retryable_and_its_status_as_unknown(settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.DEMO_PROVIDERS_URL = f"http://127.0.0.1:{port}"

    with pytest.raises(Retryable, match="connection refused"):
        capture().execute(ORDER, key="cap-1")
    outcome = capture().lookup("cap-1")
    assert isinstance(outcome, Unknown) and "refused" in outcome.reason


def test_it_stops_cleanly_on_sigterm_even_while_holding_an_answer(own_providers, procs, settings):
    settings.DEMO_PROVIDER_TIMEOUT = 0.3
    with pytest.raises(Timeout):
        client.call("POST", "/email/send", {"to": "a@example.com", "subject": "s", "body": "b"},
                    headers={"X-Fault": "timeout_after_work:60"})
    server = procs.procs[0]

    server.signal(signal.SIGTERM)
    assert server.popen.wait(timeout=5) == 0
    assert "demo providers stopped after 1 request(s)" in server.log()
    assert executions("email").count() == 1

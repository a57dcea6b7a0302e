"""``GET /runs/{id}?wait=N``: a long-poll woken by PostgreSQL NOTIFY, over real HTTP (daphne)
with a real worker finishing the runs."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from django.db import connection

from sagas.models import WorkflowRun
from sagas.waits import signal_send
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting_for_payment(api_server, key: str, business_key: str) -> str:
    """A run WAITING on a signal (which does not end a wait: the signal, not a person, resumes it)."""
    started = api_server.call("POST", "/runs", key, {"workflow": "await_payment", "input": {"timeout": 600}},
                              headers={"Idempotency-Key": business_key})
    assert started.status == 201, started.body
    run_id = started.body["id"]
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "WAITING", 20, what="the run to wait")
    return run_id


def _pay(run_id: str) -> None:
    signal_send(run_id=run_id, name="payment_confirmed", payload={"amount_cents": 100})


def test_it_answers_a_long_poll_within_100_ms_of_the_run_finishing(api_server, keys):
    api_server.worker("w1")
    lags = []
    with ThreadPoolExecutor(1) as pool:
        for i in range(5):
            run_id = _waiting_for_payment(api_server, keys["operator"], f"lag-{i}")
            sent = time.monotonic()
            poll = pool.submit(lambda: (api_server.call("GET", f"/runs/{run_id}?wait=30", keys["viewer"]), time.time()))
            time.sleep(0.3)
            assert not poll.done(), "a run waiting on a signal must not end the wait"
            _pay(run_id)
            answer, answered_at = poll.result(timeout=30)
            assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
            assert answer.body["result"] == {"confirmed": True, "payload": {"amount_cents": 100}}
            finished = datetime.fromisoformat(answer.body["finished_at"]).timestamp()
            lags.append(answered_at - finished)
            assert time.monotonic() - sent < 10
    # finished_at is the finishing transaction's start (PostgreSQL now()), so each lag includes that
    # transaction's commit too: the median is held to 100 ms, each one to 250 ms for a loaded machine.
    assert statistics.median(lags) < 0.100, lags
    assert max(lags) < 0.250, lags


def test_it_answers_a_person_needed_at_once_a_timeout_after_n_seconds_and_refuses_bad_waits(api_server, keys):
    api_server.worker("w1")
    run_id = _waiting_for_payment(api_server, keys["operator"], "timeout-1")

    began = time.monotonic()
    timed_out = api_server.call("GET", f"/runs/{run_id}?wait=1.5", keys["viewer"])
    took = time.monotonic() - began
    assert timed_out.status == 200 and timed_out.body["status"] == "WAITING"
    assert 1.5 <= took < 2.5, took

    began = time.monotonic()
    unknown = api_server.call("GET", "/runs/00000000-0000-0000-0000-000000000000?wait=30", keys["viewer"])
    malformed = api_server.call("GET", "/runs/not-a-run?wait=30", keys["viewer"])
    assert unknown.status == 404 and unknown.problem == "not-found"
    assert malformed.status == 404 and malformed.problem == "not-found"
    assert time.monotonic() - began < 1.0
    # a run outside the key's tenants is unknown to it, at once too
    hidden = api_server.call("GET", f"/runs/{run_id}?wait=30", keys["acme-operator"])
    assert hidden.status == 404

    for bad in ("0", "-1", "61", "abc", ""):
        answer = api_server.call("GET", f"/runs/{run_id}?wait={bad}", keys["viewer"])
        assert answer.status == 400 and answer.problem == "validation", (bad, answer.body)

    # An approval is a person needed: a client waiting for the run gets control back when it is asked.
    started = api_server.call("POST", "/runs", keys["operator"],
                              {"workflow": "capture_then_wait", "input": {"id": "o-wait-approval"}})
    began = time.monotonic()
    parked = api_server.call("GET", f"/runs/{started.body['id']}?wait=30", keys["viewer"])
    assert parked.body["status"] == "WAITING", parked.body
    assert time.monotonic() - began < 15
    assert WorkflowRun.objects.get(id=started.body["id"]).approvals.filter(state="PENDING").exists()


def test_it_holds_50_waits_at_once_and_survives_losing_its_listen_connection(api_server, keys):
    api_server.worker("w1")
    run_id = _waiting_for_payment(api_server, keys["operator"], "fifty-1")
    with ThreadPoolExecutor(50) as pool:
        polls = [pool.submit(api_server.call, "GET", f"/runs/{run_id}?wait=30", keys["viewer"]) for _ in range(50)]
        time.sleep(1.5)
        assert not any(p.done() for p in polls), [p.result().body for p in polls if p.done()][:2]
        began = time.monotonic()
        plain = api_server.call("GET", f"/runs/{run_id}", keys["viewer"])  # not starved by the 50 waiting
        assert plain.status == 200 and time.monotonic() - began < 1.0
        _pay(run_id)
        answers = [p.result(timeout=20) for p in polls]
    assert [a.body["status"] for a in answers] == ["COMPLETED"] * 50
    assert time.monotonic() - began < 5

    # The listener's connection dies (as in a PostgreSQL restart): a wait still answers at its
    # timeout, and once the listener is back a finish is heard again.
    run_id = _waiting_for_payment(api_server, keys["operator"], "fifty-2")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'saga-api-wait-listener' AND datname = current_database()")
        assert cur.fetchall() == [(True,)]
    began = time.monotonic()
    answer = api_server.call("GET", f"/runs/{run_id}?wait=1", keys["viewer"])
    assert answer.status == 200 and answer.body["status"] == "WAITING" and time.monotonic() - began < 2.5

    def listening() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = 'saga-api-wait-listener' AND datname = current_database()")
            return cur.fetchone()[0] == 1

    wait_until(listening, 10, what="the listener to reconnect")
    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(api_server.call, "GET", f"/runs/{run_id}?wait=30", keys["viewer"])
        time.sleep(0.3)
        began = time.monotonic()
        _pay(run_id)
        assert poll.result(timeout=30).body["status"] == "COMPLETED"
    assert time.monotonic() - began < 5

"""``GET /runs/{id}?wait=N``: a long-poll woken by PostgreSQL NOTIFY, over real HTTP (daphne)
with a real worker finishing the runs.

Nothing here is timed. That a request is waiting in the server is made observable: the test
locks the approvals table, which the server reads to decide whether a WAITING run is settled,
and sees the request's backend blocked by that lock (``pg_blocking_pids``); by then it has
subscribed to the run's changes and read the run. That an answer came before the timeout it
asked for is shown by order: a *witness* poll, with the same ``wait`` and sent first on a run
that never settles, is still unanswered when the answer arrives. How soon a finish is answered
is measured in ``bench/api.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection

from sagas.models import ApprovalRequest, WorkflowRun
from sagas.waits import signal_send
from tests.api.conftest import Answer
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Only a guard against a real hang: every wait below is for an observable state.
HANG = 300.0


class Poll:
    """``call()`` on a daemon thread of its own; ``done()`` says whether it was answered."""

    def __init__(self, call: Callable[[], Answer]) -> None:
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def body() -> None:
            try:
                self.answer = call()
            except BaseException as exc:  # noqa: BLE001 -- handed to the test
                self.error = exc
            finally:
                self._done.set()

        threading.Thread(target=body, daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Answer:
        assert self._done.wait(HANG), "the request hung"
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


def _admin() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(host=s["HOST"], port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"])


def _poll_in_flight(api_server, key: str, run_id: str, wait: float) -> Poll:
    """``GET /runs/{run_id}?wait={wait}`` sent on a thread, returned once the server is inside
    the wait: subscribed to the run's changes and past its read of the run (``run_id`` must be
    WAITING on a timer or a signal, so that the read goes on to the approvals table, where it
    is seen blocked by this test's lock). Fails if the request is answered first."""
    with _admin() as admin:
        admin.execute(f"LOCK TABLE {ApprovalRequest._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        me = admin.info.backend_pid
        poll = Poll(lambda: api_server.call("GET", f"/runs/{run_id}?wait={wait}", key))
        deadline = time.monotonic() + HANG
        with psycopg.connect(admin.info.dsn, password=connection.settings_dict["PASSWORD"] or None,
                             autocommit=True) as probe:
            while not probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND %s = ANY(pg_blocking_pids(pid)) AND application_name NOT LIKE 'sagas_worker%%'", [me],
            ).fetchone()[0]:
                assert not poll.done(), f"answered before waiting: {poll.result().body}"
                assert time.monotonic() < deadline, "the request never reached the server"
                time.sleep(0.01)
    return poll  # the lock is released here: the server's read goes on, finds nothing settled, and waits


def _waiting_for_payment(api_server, key: str, business_key: str) -> str:
    """A run WAITING on a signal (which does not end a wait: the signal, not a person, resumes it)."""
    started = api_server.call("POST", "/runs", key, {"workflow": "await_payment", "input": {"timeout": 600}},
                              headers={"Idempotency-Key": business_key})
    assert started.status == 201, started.body
    run_id = started.body["id"]
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "WAITING", HANG, what="the run to wait")
    return run_id


def _pay(run_id: str) -> None:
    signal_send(run_id=run_id, name="payment_confirmed", payload={"amount_cents": 100})


def test_it_answers_a_long_poll_when_the_run_finishes_not_at_its_timeout(api_server, keys):
    api_server.worker("w1")
    never_paid = _waiting_for_payment(api_server, keys["operator"], "witness")
    for i in range(5):
        run_id = _waiting_for_payment(api_server, keys["operator"], f"lag-{i}")
        witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
        poll = _poll_in_flight(api_server, keys["viewer"], run_id, 60)  # it has read the run WAITING
        assert not poll.done(), "a run waiting on a signal must not end the wait"
        _pay(run_id)
        answer = poll.result()
        # Woken by the finish: answered before the witness, asked for as long and sent first, timed out.
        assert not witness.done(), "answered at its timeout, not when the run finished"
        assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
        assert answer.body["result"] == {"confirmed": True, "payload": {"amount_cents": 100}}


def test_it_answers_a_person_needed_at_once_a_timeout_after_n_seconds_and_refuses_bad_waits(api_server, keys):
    api_server.worker("w1")
    run_id = _waiting_for_payment(api_server, keys["operator"], "timeout-1")
    never_paid = _waiting_for_payment(api_server, keys["operator"], "witness")

    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    # It waits (seen inside the wait, past its read of the run) ...
    timed_out = _poll_in_flight(api_server, keys["viewer"], run_id, 1.5).result()
    assert timed_out.status == 200 and timed_out.body["status"] == "WAITING"
    assert not witness.done()  # ... and answers at its own timeout, not at a longer one

    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    unknown = api_server.call("GET", "/runs/00000000-0000-0000-0000-000000000000?wait=60", keys["viewer"])
    malformed = api_server.call("GET", "/runs/not-a-run?wait=60", keys["viewer"])
    assert unknown.status == 404 and unknown.problem == "not-found"
    assert malformed.status == 404 and malformed.problem == "not-found"
    # a run outside the key's tenants is unknown to it, at once too
    hidden = api_server.call("GET", f"/runs/{run_id}?wait=60", keys["acme-operator"])
    assert hidden.status == 404
    assert not witness.done(), "a 404 waited for its timeout"

    for bad in ("0", "-1", "61", "abc", ""):
        answer = api_server.call("GET", f"/runs/{run_id}?wait={bad}", keys["viewer"])
        assert answer.status == 400 and answer.problem == "validation", (bad, answer.body)

    # An approval is a person needed: a client waiting for the run gets control back when it is asked.
    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    started = api_server.call("POST", "/runs", keys["operator"],
                              {"workflow": "capture_then_wait", "input": {"id": "o-wait-approval"}})
    parked = api_server.call("GET", f"/runs/{started.body['id']}?wait=60", keys["viewer"])
    assert parked.body["status"] == "WAITING", parked.body
    assert not witness.done(), "the wait went on past the approval being asked"
    assert WorkflowRun.objects.get(id=started.body["id"]).approvals.filter(state="PENDING").exists()


def test_it_holds_50_waits_at_once_and_survives_losing_its_listen_connection(api_server, keys):
    api_server.worker("w1")
    run_id = _waiting_for_payment(api_server, keys["operator"], "fifty-1")
    never_paid = _waiting_for_payment(api_server, keys["operator"], "witness")
    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    polls = [_poll_in_flight(api_server, keys["viewer"], run_id, 60) for _ in range(50)]  # each one waiting
    plain = api_server.call("GET", f"/runs/{run_id}", keys["viewer"])  # not starved by the 50 waiting:
    assert plain.status == 200 and plain.body["status"] == "WAITING"
    assert not any(p.done() for p in polls), [p.result().body for p in polls if p.done()][:2]  # answered before any
    _pay(run_id)
    answers = [p.result() for p in polls]
    assert [a.body["status"] for a in answers] == ["COMPLETED"] * 50
    assert not witness.done(), "the 50 were answered at their timeout, not when the run finished"

    # The listener's connection dies (as in a PostgreSQL restart): a wait still answers at its
    # timeout, and once the listener is back a finish is heard again.
    run_id = _waiting_for_payment(api_server, keys["operator"], "fifty-2")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'saga-api-wait-listener' AND datname = current_database()")
        assert cur.fetchall() == [(True,)]
    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    answer = api_server.call("GET", f"/runs/{run_id}?wait=1", keys["viewer"])
    assert answer.status == 200 and answer.body["status"] == "WAITING"
    assert not witness.done(), "a wait of 1 s was answered only at a longer timeout"

    def listening() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = 'saga-api-wait-listener' AND datname = current_database()")
            return cur.fetchone()[0] == 1

    wait_until(listening, HANG, what="the listener to reconnect")
    witness = _poll_in_flight(api_server, keys["viewer"], never_paid, 60)
    poll = _poll_in_flight(api_server, keys["viewer"], run_id, 60)
    _pay(run_id)
    assert poll.result().body["status"] == "COMPLETED"
    assert not witness.done(), "the finish was not heard: the wait ended at its timeout"

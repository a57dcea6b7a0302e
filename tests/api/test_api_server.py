"""The API over real HTTP, served by daphne, with a real worker finishing what it starts."""

from __future__ import annotations

import pytest

from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_starts_a_run_over_http_and_a_worker_completes_it(api_server, keys):
    started = api_server.call("POST", "/runs", keys["operator"], {"workflow": "capture_only", "input": {"id": "o-http-1"}},
                              headers={"Idempotency-Key": "http-1"})
    assert started.status == 201, started.body
    run_id = started.body["id"]
    assert started.body["console_url"].endswith(f"/runs/{run_id}/")
    api_server.worker("w1")
    wait_until(lambda: api_server.call("GET", f"/runs/{run_id}", keys["viewer"]).body["status"] == "COMPLETED", 30,
               what="the run to complete")
    anonymous = api_server.call("GET", f"/runs/{run_id}")
    assert anonymous.status == 401 and anonymous.problem == "unauthenticated"

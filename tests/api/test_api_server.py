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


def test_it_keeps_no_database_connection_open_per_request(api_server, keys):
    """Under daphne each request's sync code runs in a thread of its own: a persistent connection
    there was never reused nor closed, and 80 requests left 9 connections open (the server's
    limit is 100 for everyone). The web process now draws from a pool: a couple of connections
    serve one client's requests one after another, however many."""
    from django.db import connection

    def open_connections() -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()")
            return cur.fetchone()[0]

    before = open_connections()
    for _ in range(160):
        assert api_server.call("GET", "/runs/00000000-0000-0000-0000-000000000000", keys["viewer"]).status == 404
    assert open_connections() <= before + 3


def test_importing_the_asgi_app_leaves_no_pool_setting_in_the_environment():
    """config/asgi.py gives the web process a connection pool through the environment while the
    settings are read. Left there, it reached every worker and bench a test process started
    after importing the ASGI app (for a websocket test): their forked children shared the pool's
    open connections (a hung agents smoke run, a chaos run reading a child's INSERT)."""
    import os

    import config.asgi  # noqa: F401

    assert "DB_POOL_SIZE" not in os.environ and "DB_CONN_MAX_AGE" not in os.environ

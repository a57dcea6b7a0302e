"""DATABASE_URL as an operator writes it: one host, or the host list of a failover pair
(what ``pg_autoctl show uri`` prints), and a clear error for what libpq would misread."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import parse_database_url


def test_a_failover_pairs_host_list_reaches_libpq_as_its_host_and_port_lists():
    db = parse_database_url(
        "postgres://saga_app:s%40cret@db-a:5432,db-b:6432/saga_console?target_session_attrs=read-write"
    )
    assert (db["HOST"], db["PORT"], db["USER"], db["PASSWORD"], db["NAME"]) == (
        "db-a,db-b", "5432,6432", "saga_app", "s@cret", "saga_console")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write"}


def test_one_host_and_ipv6_hosts_parse_as_before():
    assert (parse_database_url("postgres://postgres@127.0.0.1:5432/saga")["HOST"],
            parse_database_url("postgres://postgres@127.0.0.1:5432/saga")["PORT"]) == ("127.0.0.1", "5432")
    db = parse_database_url("postgres://u@[::1]:5433,[fd00::2]/saga")
    assert (db["HOST"], db["PORT"]) == ("::1,fd00::2", "5433,")  # libpq: an empty port is the default
    assert parse_database_url("postgres:///saga")["HOST"] == ""  # the local socket


@pytest.mark.parametrize("url, says", [
    ("postgres://db-a:54x2/saga", "malformed port"),
    ("postgres://db-a:70000/saga", "malformed port"),
    ("postgres://db-a:5432,,db-b:5432/saga", "empty host"),
    ("postgres://[::1:5432/saga", "malformed host"),
    ("mysql://db-a/saga", "not supported"),
    ("postgres://db-a,db-b/", "no database name"),
])
def test_a_malformed_url_is_refused_at_start_with_what_is_wrong(url, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        parse_database_url(url)

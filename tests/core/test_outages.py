"""The outage log of a process: one line when a store goes away and one when it is back,
however many threads, sockets and pages meet the outage, so that a monitor alerting on these
lines pages once per outage, not once per page or retry."""

from __future__ import annotations

import logging

import pytest

from core.storage import Outages


@pytest.fixture
def outages(caplog):
    caplog.set_level(logging.DEBUG, logger="sagas.storage")
    return Outages()


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends_whoever_reports_it(outages, caplog):
    for _ in range(50):  # fifty sockets and retry loops meet the same outage
        outages.down("Redis", ConnectionError("Connection refused"), doing="serving live pages")
    for _ in range(50):
        outages.up("Redis")
    found = lines(caplog)
    assert found[0] == ("storage outage: Redis unreachable while serving live pages "
                        "(ConnectionError: Connection refused); backing off and retrying")
    assert len(found) == 2 and found[1].startswith("storage outage over: Redis answers again after ")
    assert outages.count["Redis"] == 1 and not outages.is_down("Redis")


def test_a_failure_after_the_store_came_back_is_a_new_outage_said_at_once(outages, caplog):
    outages.down("PostgreSQL", "terminating connection due to administrator command")
    outages.up("PostgreSQL")
    outages.down("PostgreSQL", "terminating connection due to administrator command")
    assert outages.is_down("PostgreSQL") and outages.count["PostgreSQL"] == 2
    assert [line.split(":")[0] for line in lines(caplog)] == ["storage outage", "storage outage over",
                                                              "storage outage"]


def test_each_store_has_its_own_outage(outages, caplog):
    outages.down("Redis", "refused")
    outages.down("PostgreSQL", "no answer")
    outages.up("Redis")
    assert outages.is_down("PostgreSQL") and not outages.is_down("Redis")
    assert len(lines(caplog)) == 3

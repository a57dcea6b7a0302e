"""The outage log of a process: one line when a store goes away, one when it is back.

A request that began before the store came back can fail just after it did (a pooled
connection to the old server, a blocking read that was already waiting). That is the
end of the same outage, not a second one: a monitor that alerts on these lines would
otherwise page twice for one restart.
"""

from __future__ import annotations

import logging

import pytest

from core.storage import FLAP_SECONDS, Outages


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def outages(caplog):
    caplog.set_level(logging.DEBUG, logger="sagas.storage")
    clock = Clock()
    return Outages(clock=clock), clock


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends_whoever_reports_it(outages, caplog):
    out, clock = outages
    for _ in range(50):  # fifty sockets and retry loops meet the same outage
        out.down("Redis", ConnectionError("Connection refused"), doing="serving live pages")
    clock.now += 6
    out.up("Redis")
    out.up("Redis")
    assert lines(caplog) == [
        "storage outage: Redis unreachable while serving live pages (ConnectionError: Connection refused); "
        "backing off and retrying",
        "storage outage over: Redis answers again after 6.0 s",
    ]
    assert out.count["Redis"] == 1


def test_a_failure_just_after_it_came_back_is_the_same_outage_ending_not_a_second_one(outages, caplog):
    out, clock = outages
    out.down("Redis", ConnectionError("Connection refused"))
    clock.now += 6
    out.up("Redis")  # one page reconnects
    clock.now += 0.2
    out.down("Redis", ConnectionError("Connection closed by server"))  # a read begun before the restart
    assert out.is_down("Redis")
    clock.now += 0.5
    out.up("Redis")
    assert len(lines(caplog)) == 2, lines(caplog)
    assert out.count["Redis"] == 1
    assert "after 0.5 s" not in " ".join(lines(caplog))


def test_a_store_that_stays_away_after_a_short_return_is_reported_once_it_outlasts_the_grace(outages, caplog):
    out, clock = outages
    out.down("Redis", "refused")
    clock.now += 6
    out.up("Redis")
    clock.now += 1
    out.down("Redis", "refused")  # gone again: quiet for now
    assert len(lines(caplog)) == 2
    clock.now += FLAP_SECONDS  # still failing past the grace: a real second outage, said late
    out.down("Redis", "refused", doing="waiting for jobs")
    assert lines(caplog)[2].startswith("storage outage: Redis unreachable again since 1.0 s after it came back"), \
        lines(caplog)
    clock.now += 10
    out.up("Redis")
    assert lines(caplog)[3] == f"storage outage over: Redis answers again after {10 + FLAP_SECONDS:.1f} s"
    assert out.count["Redis"] == 2


def test_a_failure_long_after_the_last_outage_is_a_new_outage_at_once(outages, caplog):
    out, clock = outages
    out.down("PostgreSQL", "no answer")
    clock.now += 3
    out.up("PostgreSQL")
    clock.now += FLAP_SECONDS + 1
    out.down("PostgreSQL", "no answer")
    assert len(lines(caplog)) == 3 and lines(caplog)[2].startswith("storage outage: PostgreSQL unreachable")
    assert out.count["PostgreSQL"] == 2

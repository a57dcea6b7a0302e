"""Letting held calls go: the pump turns tickets GRANTED, in fair order, as capacity allows.

One pass over each bucket with waiting tickets, in its own transaction, holding the bucket's
row (``FOR UPDATE SKIP LOCKED``: pumps in several processes and hosts never let the same
capacity go twice, and never wait for each other). How many tickets go:

* none while the connector is paused, or its circuit is open and cooling down;
* one, the trial, once the cool-down has passed (the circuit goes half-open with it);
* otherwise as many as the rate has tokens for within ``LOOKAHEAD_SECONDS`` on its own clock
  for letting calls go (``FlowBucket.grant_tat``: calls are let go at the rate, however long
  each takes to reach its dispatch, with at most ``MAX_AHEAD_SECONDS`` of the rate on their
  way), and the concurrency limit has free slots for, less the tickets let go already and not
  yet taken. The rate itself is held where calls leave: the gate's ``tat``.

Tickets go in ``(tag, id)`` order (start-time fair queueing between lanes, oldest first within
one, ``ledger.flow.gate.hold``). Their runs are woken after the commit (``tickets_granted``); a
granted ticket takes its token when its run dispatches, so the limits hold at the moment calls
leave, however late a run comes. A granted ticket not taken within ``GRANT_TTL_SECONDS`` (a
wake-up lost with Redis, a worker that died) stops counting and its run is woken again.

The worker processes run ``pump`` every ``PUMP_INTERVAL`` seconds while calls wait, and the
sweeper once per pass.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from ledger.connectors import get_connector
from ledger.errors import ConnectorNotRegistered
from ledger.flow import gate
from ledger.models import CircuitState
from ledger.signals import send_tickets_granted

log = logging.getLogger("ledger.flow.pump")

LOOKAHEAD_SECONDS = 0.25
MAX_AHEAD_SECONDS = 2.0  # calls let go and not yet dispatched, at most, in seconds of the rate
GRANT_TTL_SECONDS = 10.0
PUMP_INTERVAL = 0.05
BATCH = 500  # tickets let go at most per bucket and pass (an unlimited connector resumed after a pause)


def buckets_with_work() -> list[tuple[str, str]]:
    """(connector, key) of each bucket with a waiting ticket, or a granted one gone stale."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT b.connector, b.key FROM ledger_flowbucket b
               WHERE EXISTS (SELECT 1 FROM ledger_flowticket t WHERE t.connector = b.connector
                               AND t.key = b.key AND t.state = 'waiting')
                  OR EXISTS (SELECT 1 FROM ledger_flowticket t WHERE t.connector = b.connector
                               AND t.key = b.key AND t.state = 'granted' AND t.granted_at < %s)""",
            [timezone.now() - timedelta(seconds=GRANT_TTL_SECONDS)],
        )
        return [(c, k) for c, k in cur.fetchall()]


def pump() -> int:
    """One pass over every bucket with work; the number of tickets let go (or woken again)."""
    return sum(pump_bucket(connector, key) for connector, key in buckets_with_work())


def _deadline(connector: str) -> float:
    try:
        return float(get_connector(connector).deadline_seconds)
    except ConnectorNotRegistered:
        return 30.0


def pump_bucket(connector: str, key: str) -> int:
    """Let go what one bucket has capacity for; 0 if another process holds it right now."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            """SELECT tat, grant_tat, vtime, circuit, opened_at, changed_at FROM ledger_flowbucket
               WHERE connector = %s AND key = %s FOR UPDATE SKIP LOCKED""",
            [connector, key],
        )
        bucket = cur.fetchone()
        if bucket is None:
            return 0
        tat, grant_tat, _vtime, circuit, opened_at, changed_at = bucket
        grant_from = None  # where the grant clock starts, when the rate paces what goes
        cur.execute(
            """SELECT rate, burst, max_in_flight, paused_at IS NOT NULL, circuit_cooldown_seconds
               FROM ledger_connectorflow WHERE connector = %s""",
            [connector],
        )
        flow = cur.fetchone() or (None, 1, None, False, 30.0)
        rate, burst, max_in_flight, paused, cooldown = flow
        if paused:
            return 0
        now = timezone.now()
        stale_before = now - timedelta(seconds=GRANT_TTL_SECONDS)
        cur.execute(
            """UPDATE ledger_flowticket SET granted_at = %s
               WHERE connector = %s AND key = %s AND state = 'granted' AND granted_at < %s RETURNING run_id""",
            [now, connector, key, stale_before],
        )
        woken = [str(run_id) for (run_id,) in cur.fetchall()]
        cur.execute(
            "SELECT count(*) FROM ledger_flowticket WHERE connector = %s AND key = %s AND state = 'granted'",
            [connector, key],
        )
        outstanding = int(cur.fetchone()[0]) - len(woken)
        deadline = _deadline(connector)
        trial = False
        if circuit == CircuitState.HALF_OPEN and changed_at is not None and \
                changed_at < now - timedelta(seconds=deadline + cooldown):
            circuit, opened_at = CircuitState.OPEN, now - timedelta(seconds=cooldown)  # the trial never reported
        if circuit == CircuitState.OPEN:
            if now < opened_at + timedelta(seconds=cooldown) or outstanding > 0:
                capacity = 0
            else:
                capacity, trial = 1, True
        elif circuit == CircuitState.HALF_OPEN:
            capacity = 0
        elif rate is None and max_in_flight is None:
            capacity = BATCH - outstanding  # a paused or broken connector without limits, released
        else:
            capacity = BATCH
            if rate is not None:
                # Paced by the grant clock, not by what is still on its way: a call let go takes a
                # wake-up, a claim and a replay to reach its dispatch, and counting those against
                # the next quarter second's tokens capped a 50/s burst at 35 to 41/s. What is on its
                # way is bounded apart (MAX_AHEAD_SECONDS of the rate).
                grant_from = max(grant_tat or now, tat or now, now)  # calls sent straight away count too
                tokens = math.floor(
                    (now + timedelta(seconds=LOOKAHEAD_SECONDS) - grant_from).total_seconds() * rate + burst)
                capacity = min(capacity, max(0, tokens),
                               max(0, math.floor(rate * MAX_AHEAD_SECONDS + burst) - outstanding))
            if max_in_flight is not None:
                cur.execute(
                    """SELECT count(*) FROM ledger_effectrecord WHERE status = 'IN_PROGRESS' AND connector = %s
                       AND flow_key = %s AND dispatched_at > %s""",
                    [connector, key, now - timedelta(seconds=deadline)],
                )
                capacity = min(capacity, max(0, max_in_flight - int(cur.fetchone()[0])) - outstanding)
        granted: list[tuple[str, int, int]] = []
        if capacity > 0:
            cur.execute(
                """UPDATE ledger_flowticket SET state = 'granted', granted_at = %s
                   WHERE id IN (SELECT id FROM ledger_flowticket WHERE connector = %s AND key = %s
                                  AND state = 'waiting' ORDER BY tag, id LIMIT %s FOR UPDATE SKIP LOCKED)
                   RETURNING run_id, effect_id, tag""",
                [now, connector, key, capacity],
            )
            granted = [(str(run_id), effect_id, tag) for run_id, effect_id, tag in cur.fetchall()]
        if granted:
            cur.execute(
                """UPDATE ledger_flowbucket SET vtime = greatest(vtime, %s),
                       grant_tat = coalesce(%s, grant_tat),
                       circuit = CASE WHEN %s THEN 'half_open' ELSE circuit END,
                       trial_effect_id = CASE WHEN %s THEN %s ELSE trial_effect_id END,
                       changed_at = CASE WHEN %s THEN %s ELSE changed_at END
                   WHERE connector = %s AND key = %s""",
                [max(tag for _, _, tag in granted),
                 grant_from + timedelta(seconds=len(granted) / rate) if grant_from is not None and rate else None,
                 trial, trial, granted[0][1], trial, now, connector, key],
            )
        if granted and trial:
            gate.circuit_changed(connector, key, CircuitState.HALF_OPEN, failures=0, error="", at=now)
        runs = sorted({run_id for run_id, _, _ in granted} | set(woken))
        if runs:
            send_tickets_granted(runs=runs)
    return len(granted) + len(woken)

"""The gate every dispatch of an effect passes: may this call leave now?

``admit`` runs inside the transaction that records the dispatch (the intent's commit for
connectors that need no separate mark, the PENDING -> IN_PROGRESS mark for the others), so a
call is counted against its limits exactly when it is recorded as sent, and a call that the
gate holds back is never recorded as sent: its record stays PENDING, which recovery treats as
"never dispatched", and it can never become UNKNOWN.

What holds a call, in this order: the connector is paused; its circuit is open (or half-open,
with another call as the trial); calls queue for its limits already (a newcomer goes to the back
of the queue, ``FlowTicket``); too many calls are out (``max_in_flight``); the rate limiter has no
token (GCRA on ``FlowBucket.tat``). A held call gets a ticket and the caller stops (the engine
suspends the run, holding no worker); ``ledger.flow.pump`` lets tickets go in fair order and
wakes their runs. A ticket that was let go (GRANTED) may wait in its thread for its token, up to
``IN_THREAD_SECONDS``.

Cost on a connector without limits, pause or open circuit: one indexed read in a transaction
that is open anyway, no write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from ledger.models import CircuitChange, CircuitState, EffectRecord, FlowTicket, HoldReason, TicketState
from ledger.signals import send_circuit_changed

# A call let go by the pump whose token comes within this many seconds waits in its thread.
IN_THREAD_SECONDS = 1.0
# A new call, with nobody queued, whose token comes within this many seconds waits in its thread
# rather than suspending its run (a suspension and wake-up cost more than that).
IN_THREAD_NEW_SECONDS = 0.05
# A held run is woken by then at the latest, to look again, whatever else happens (lost wake-ups).
SAFETY_WAKE_SECONDS = 300.0


@dataclass(frozen=True)
class Decision:
    """What the gate says about one dispatch: go, or wait (``retry_in`` seconds in the
    thread, or, with ``retry_in`` None, held: the caller stops until its ticket is let go)."""

    go: bool
    reason: str = ""
    retry_in: float | None = None


GO = Decision(True)


@dataclass(frozen=True)
class Hold:
    """A call held back by flow control, as the engine and the run page show it."""

    connector: str
    reason: str
    position: int
    wake_at: datetime

    def describe(self) -> str:
        return f"waiting for {self.connector} ({HoldReason(self.reason).label}, position {self.position})"

    def as_dict(self) -> dict[str, Any]:
        return {"connector": self.connector, "reason": self.reason, "position": self.position}


def flow_key_of(key_field: str, *, tenant: str, payload: Any) -> str:
    """The value the connector's limits are kept per: the tenant, a (dotted) payload field, or ""."""
    if not key_field:
        return ""
    if key_field == "tenant":
        return tenant
    value: Any = payload
    for part in key_field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)[:200]


_STATE_SQL = """
    SELECT f.rate, f.burst, f.max_in_flight, f.paused_at IS NOT NULL, f.circuit_cooldown_seconds,
           b.circuit, b.opened_at, b.trial_effect_id,
           EXISTS (SELECT 1 FROM ledger_flowticket t
                   WHERE t.connector = f.connector AND t.key = %(key)s AND t.state = 'waiting'),
           m.id, m.state
    FROM ledger_connectorflow f
    LEFT JOIN ledger_flowbucket b ON b.connector = f.connector AND b.key = %(key)s
    LEFT JOIN ledger_flowticket m ON m.effect_id = %(effect)s
    WHERE f.connector = %(connector)s
"""


def key_field_of(connector: str) -> str:
    """The connector's ``key_field`` (what its limits are kept per), "" without a flow row."""
    with connection.cursor() as cur:
        cur.execute("SELECT key_field FROM ledger_connectorflow WHERE connector = %s", [connector])
        row = cur.fetchone()
    return row[0] if row else ""


def admit(effect: EffectRecord, *, deadline_seconds: float, new: bool = False) -> Decision:
    """May ``effect`` be dispatched now? Call inside the transaction that records the dispatch.

    GO takes what the call uses (a rate token; the in-flight count is the IN_PROGRESS records
    themselves) and drops its ticket if it had one. ``new``: the effect's record is being
    created in this transaction (it has no ticket and cannot be a circuit's trial yet).
    """
    now = timezone.now()
    with connection.cursor() as cur:
        cur.execute(_STATE_SQL, {"connector": effect.connector, "key": effect.flow_key,
                                 "effect": -1 if new or effect.pk is None else effect.pk})
        row = cur.fetchone()
    if row is None:
        return GO  # no flow row: a connector nobody limits, which has never failed
    (rate, burst, max_in_flight, paused, cooldown, circuit, opened_at, trial, waiting, mine, mine_state) = row
    granted = mine_state == TicketState.GRANTED
    if paused:
        return Decision(False, HoldReason.PAUSED)
    if circuit == CircuitState.OPEN:
        if new or (waiting and not granted) or now < opened_at + timedelta(seconds=cooldown):
            return Decision(False, HoldReason.CIRCUIT)
        if not _start_trial(effect, now):
            return Decision(False, HoldReason.CIRCUIT)
    elif circuit == CircuitState.HALF_OPEN and (new or trial != effect.pk):
        return Decision(False, HoldReason.CIRCUIT)
    if waiting and not granted:
        return Decision(False, _queue_reason(rate, max_in_flight))
    if rate is None and max_in_flight is None:
        if mine is not None:
            FlowTicket.objects.filter(id=mine).delete()
        return GO
    tat = _lock_bucket(effect.connector, effect.flow_key)
    if max_in_flight is not None and _in_flight(effect, now, deadline_seconds) >= max_in_flight:
        return Decision(False, HoldReason.CONCURRENCY)
    if rate is not None:
        interval = 1.0 / rate
        start = max(tat or now, now)
        wait = (start - now).total_seconds() - (burst - 1) * interval
        if wait > 0:
            if granted:
                return Decision(False, HoldReason.RATE, retry_in=wait)
            if wait <= IN_THREAD_NEW_SECONDS and not waiting:
                return Decision(False, HoldReason.RATE, retry_in=wait)
            return Decision(False, HoldReason.RATE)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE ledger_flowbucket SET tat = %s WHERE connector = %s AND key = %s",
                [start + timedelta(seconds=interval), effect.connector, effect.flow_key],
            )
    if mine is not None:
        FlowTicket.objects.filter(id=mine).delete()
    return GO


def _queue_reason(rate: float | None, max_in_flight: int | None) -> str:
    """Why a newcomer waits when others queue already: the limit that makes the queue."""
    if rate is not None:
        return HoldReason.RATE
    if max_in_flight is not None:
        return HoldReason.CONCURRENCY
    return HoldReason.QUEUED


def _lock_bucket(connector: str, key: str) -> datetime | None:
    """Lock the bucket's row for this transaction (created if missing); its ``tat``."""
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO ledger_flowbucket (connector, key, vtime, circuit, failures)
               VALUES (%s, %s, 0, 'closed', 0) ON CONFLICT (connector, key) DO NOTHING""",
            [connector, key],
        )
        cur.execute("SELECT tat FROM ledger_flowbucket WHERE connector = %s AND key = %s FOR UPDATE",
                    [connector, key])
        return cur.fetchone()[0]


def _in_flight(effect: EffectRecord, now: datetime, deadline_seconds: float) -> int:
    """Calls of this bucket out right now: IN_PROGRESS records dispatched within the connector's
    deadline (an older one belongs to a worker that died or gave up: it frees its slot by then)."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT count(*) FROM ledger_effectrecord
               WHERE status = 'IN_PROGRESS' AND connector = %s AND flow_key = %s AND dispatched_at > %s AND id <> %s""",
            [effect.connector, effect.flow_key, now - timedelta(seconds=deadline_seconds),
             effect.pk if effect.pk is not None else -1],
        )
        return int(cur.fetchone()[0])


def _start_trial(effect: EffectRecord, now: datetime) -> bool:
    """OPEN -> HALF_OPEN with this effect as the one trial call; False if another got there first."""
    with connection.cursor() as cur:
        cur.execute(
            """UPDATE ledger_flowbucket SET circuit = 'half_open', trial_effect_id = %s, changed_at = %s
               WHERE connector = %s AND key = %s AND circuit = 'open'""",
            [effect.pk, now, effect.connector, effect.flow_key],
        )
        started = cur.rowcount == 1
    if started:
        circuit_changed(effect.connector, effect.flow_key, CircuitState.HALF_OPEN, failures=0, error="", at=now)
    return started


def hold(effect: EffectRecord, reason: str, *, rate: float | None = None) -> Hold:
    """Give ``effect`` a ticket (or put its ticket back in the queue, keeping its place) and say
    where it stands. Call in the transaction whose ``admit`` said no."""
    _lock_bucket(effect.connector, effect.flow_key)
    now = timezone.now()
    ticket = FlowTicket.objects.filter(effect_id=effect.pk).first()
    if ticket is None:
        with connection.cursor() as cur:
            # Start-time fair queueing: a lane (tenant) with a backlog gets the tags after its last
            # one; a lane with none starts at the bucket's virtual time, next to what goes now.
            cur.execute(
                """SELECT greatest(b.vtime, coalesce(
                       (SELECT max(tag) FROM ledger_flowticket t WHERE t.connector = b.connector
                          AND t.key = b.key AND t.lane = %s AND t.state = 'waiting'), 0)) + 1
                   FROM ledger_flowbucket b WHERE b.connector = %s AND b.key = %s""",
                [effect.tenant, effect.connector, effect.flow_key],
            )
            tag = cur.fetchone()[0]
        ticket = FlowTicket.objects.create(
            effect_id=effect.pk, run_id=effect.run_id, connector=effect.connector, key=effect.flow_key,
            lane=effect.tenant, tag=tag, reason=reason, created_at=now,
        )
    elif ticket.state != TicketState.WAITING or ticket.reason != reason:
        ticket.state, ticket.reason, ticket.granted_at = TicketState.WAITING, reason, None
        ticket.save(update_fields=["state", "reason", "granted_at"])
    position = position_of(ticket)
    return Hold(connector=effect.connector, reason=reason, position=position,
                wake_at=now + timedelta(seconds=_expected_wait(reason, position, rate)))


def _expected_wait(reason: str, position: int, rate: float | None) -> float:
    """When to look again at the latest: the queue's expected wait, bounded, when a rate is known."""
    if reason == HoldReason.RATE and rate:
        return min(SAFETY_WAKE_SECONDS, max(1.0, 2.0 * position / rate + 1.0))
    return SAFETY_WAKE_SECONDS


def position_of(ticket: FlowTicket) -> int:
    """1 for the next call to go, then 2, ...: waiting tickets of its bucket before it, plus one."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT count(*) FROM ledger_flowticket
               WHERE connector = %s AND key = %s AND state = 'waiting' AND (tag, id) < (%s, %s)""",
            [ticket.connector, ticket.key, ticket.tag, ticket.id],
        )
        return int(cur.fetchone()[0]) + 1


# --- the circuit breaker's count -----------------------------------------------------------


def record_failure(effect: EffectRecord) -> None:
    """A retryable failure or a call with no answer: count it towards opening the circuit.
    Inside the transaction that records the failure."""
    now = timezone.now()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT circuit_failures, circuit_window_seconds FROM ledger_connectorflow WHERE connector = %s",
            [effect.connector],
        )
        row = cur.fetchone()
        if row is None or row[0] == 0:
            return
        threshold, window = row
        cur.execute(
            """INSERT INTO ledger_flowbucket AS b (connector, key, vtime, circuit, failures, first_failure_at)
               VALUES (%(c)s, %(k)s, 0, 'closed', 1, %(now)s)
               ON CONFLICT (connector, key) DO UPDATE SET
                 failures = CASE WHEN b.first_failure_at > %(since)s THEN b.failures + 1 ELSE 1 END,
                 first_failure_at = CASE WHEN b.first_failure_at > %(since)s THEN b.first_failure_at ELSE %(now)s END
               RETURNING failures, circuit, trial_effect_id""",
            {"c": effect.connector, "k": effect.flow_key, "now": now, "since": now - timedelta(seconds=window)},
        )
        failures, circuit, trial = cur.fetchone()
        opens = (circuit == CircuitState.CLOSED and failures >= threshold) or (
            circuit == CircuitState.HALF_OPEN and trial == effect.pk)
        if opens:
            cur.execute(
                """UPDATE ledger_flowbucket SET circuit = 'open', opened_at = %s, changed_at = %s,
                          trial_effect_id = NULL WHERE connector = %s AND key = %s""",
                [now, now, effect.connector, effect.flow_key],
            )
            circuit_changed(effect.connector, effect.flow_key, CircuitState.OPEN, failures=failures,
                            error=effect.error_message, at=now)


def record_success(effect: EffectRecord) -> None:
    """The provider answered: reset the failure count; the trial call's success closes the
    circuit. No write unless there is something to reset."""
    with connection.cursor() as cur:
        cur.execute(
            """UPDATE ledger_flowbucket b SET failures = 0, first_failure_at = NULL,
                   circuit = CASE WHEN b.circuit = 'half_open' AND b.trial_effect_id = %(e)s THEN 'closed'
                                  ELSE b.circuit END,
                   trial_effect_id = CASE WHEN b.circuit = 'half_open' AND b.trial_effect_id = %(e)s THEN NULL
                                          ELSE b.trial_effect_id END,
                   changed_at = CASE WHEN b.circuit = 'half_open' AND b.trial_effect_id = %(e)s THEN now()
                                     ELSE b.changed_at END
               WHERE connector = %(c)s AND key = %(k)s
                 AND (failures > 0 OR (circuit = 'half_open' AND trial_effect_id = %(e)s))
               RETURNING circuit, (SELECT circuit FROM ledger_flowbucket o WHERE o.id = b.id)""",
            {"c": effect.connector, "k": effect.flow_key, "e": effect.pk},
        )
        row = cur.fetchone()
    if row is not None and row[0] == CircuitState.CLOSED and row[1] != CircuitState.CLOSED:
        circuit_changed(effect.connector, effect.flow_key, CircuitState.CLOSED, failures=0, error="",
                        at=timezone.now())


def circuit_changed(connector: str, key: str, state: str, *, failures: int, error: str, at: datetime) -> None:
    """Record a circuit's new state (``CircuitChange``) and, after the commit, tell the listeners
    (the console's notifications). Inside the transaction that changed it."""
    CircuitChange.objects.create(connector=connector, key=key, state=state, failures=failures,
                                 error=error[:4000], at=at)
    send_circuit_changed(connector=connector, key=key, state=state, failures=failures, error=error)


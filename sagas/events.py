"""Signals the engine sends about runs, for whoever wants to know (the console's live pages).

The engine knows nothing of its listeners: no HTML, no Channels, no Redis here.

``run_changed`` (kwargs ``run_id: str``, ``status: str``, ``cause: str``) is sent after
the change is committed: a run's status moved or its history gained entries outside a
worker's step loop (claims, outcomes, suspensions, compensation items, operator and
service actions, wake-ups). ``status`` is the run's status after the change. ``cause``
says what happened: an engine outcome (``claimed``, ``completed``, ``failed``,
``needs_attention``, ``waiting``, ``yielded``, ``compensated``), the journal kind a
service wrote (``started``, ``cancelled``, ``approval_decided``, ``signal_received``,
``timer_fired``, ``effect_resolved``, ``resumed``, ``halted``, ``operator_action``,
``compensation_started``, ``compensation_item``), or ``progress``.

Guarantees: never sent for a change that rolled back; never sent per pure step (a
step stays one commit and nothing else). While steps progress, the worker's heartbeat
sends ``cause="progress"`` at most once per ``PROGRESS_INTERVAL`` seconds per run. A claim
is announced (``claimed``) by that heartbeat 0.2 s after it, only if the run is still under
way then: a run that leaves the worker sooner is announced once, by its outcome.
Not guaranteed: delivery across processes, or exactly one signal per change (a
listener must treat a signal as "look again", not as a counted event). A failing
receiver is logged and never raises into the engine.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection, transaction
from django.dispatch import Signal

log = logging.getLogger("sagas.events")

run_changed = Signal()

# ``swept`` (kwargs ``report``: the pass's ``SweepReport``) is sent after each sweeper pass, in
# the process that swept, for listeners that catch up from PostgreSQL on the sweeper's rhythm
# (the console's notifications). A failing receiver is logged and never raises into the sweeper.
swept = Signal()

# Seconds between two "progress" signals of one run (sent by the worker's heartbeat).
PROGRESS_INTERVAL = 1.0


def send_run_changed(run_id: Any, status: str, *, cause: str) -> None:
    """Send ``run_changed`` once the current transaction commits (at once outside one)."""
    if connection.in_atomic_block:
        transaction.on_commit(lambda: send_run_changed_now(run_id, status, cause=cause))
    else:
        send_run_changed_now(run_id, status, cause=cause)


def send_run_changed_now(run_id: Any, status: str, *, cause: str) -> None:
    """Send ``run_changed`` now; the caller has committed (or writes nothing). Never raises."""
    for receiver, result in run_changed.send_robust(
        sender=None, run_id=str(run_id), status=str(status), cause=str(cause)
    ):
        if isinstance(result, Exception):
            log.error("run_changed receiver %r failed for run %s: %s", receiver, run_id, result, exc_info=result)


def send_swept(report: Any) -> None:
    """Send ``swept`` after a sweeper pass. Never raises."""
    for receiver, result in swept.send_robust(sender=None, report=report):
        if isinstance(result, Exception):
            log.error("swept receiver %r failed: %s", receiver, result, exc_info=result)

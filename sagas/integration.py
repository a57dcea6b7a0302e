"""What operator tools built on the engine use beyond the public API: the extension module.

The console and the HTTP API steer runs through these, next to ``sagas``'s public functions.
They are kept stable like the public API; everything else under ``sagas`` is internal and may
move. The other extension modules are ``sagas.models`` (the tables, to read), ``sagas.selectors``
(reads), ``sagas.errors``, ``sagas.events`` (Django signals about runs, for live pages),
``sagas.agents`` (pydantic-ai) and ``sagas.testing`` (for tests of your own workflows).

* Locks, in the engine's one lock order (run, then its approvals, effects and plan): an action
  that checks the state a person saw takes them first (``run_lock``, ``approval_lock``,
  ``effect_lock``).
* Actions that take a user and a reason, each one transaction: ``run_cancel``, ``run_retry``,
  ``compensation_start``, ``compensation_preview``, ``approval_decide``, ``signal_send``,
  ``run_pause``, ``run_resume``, ``workflow_pause``, ``workflow_resume``, ``run_move``,
  ``run_redrive``; the replay check (``check_run`` for one run, ``replay_check`` of ``runs_to_check`` against
  ``definition_for``) and ``movable_versions``.
* The wake-up transport: ``redis_connection``, and ``get_queue(compensation_queue_name())``,
  the queue every worker reads (for jobs of your own, which take ids).
* Reading what the engine keeps:
  ``chain_place`` and ``CONTINUED_AS_NEW`` (runs that continued as new), ``ERROR_KEY`` (a
  summary that could not be computed), the archive (``store_for_location``, ``run_lines``,
  ``ArchivedBatch``, ``runs_archived``), ``shutdown_requested`` (a worker is stopping),
  ``run_is_paused``, ``run_pause_info`` and ``workflow_pause_of`` (what holds a run), and
  ``run_counts`` (runs per status and reason, kept as runs change: nothing is counted) and
  ``in_flight_counts`` (runs in flight per version and status, kept the same way), and
  ``key_holds_grams`` (a filter on runs served by the index of every 3- and 4-character piece
  of their business key: the search by key, ``sagas.store.key_grams``; a term of up to
  ``KEY_GRAMS_EXACT_UP_TO`` characters and at least ``KEY_GRAMS_SHORTEST`` is answered
  exactly).
* Checks of what callers pass: ``checked_text``, ``SIGNAL_NAME_CHARS``.
* Tracing (``sagas.tracing``; off unless ``SAGAS_TRACING``): ``trace_headers()``, the W3C
  ``traceparent`` of the effect or compensation in flight, for a connector to send with its
  request; ``trace_id_hex(run_id)``, a run's trace id (its UUID's hex), and ``trace_url(run_id)``,
  the link ``SAGAS_TRACE_URL_TEMPLATE`` makes of it ("" when unset).
* Schedules (``sagas.schedules``): ``ScheduleSpec`` and its choices (``CATCH_UP_CHOICES``,
  ``OVERLAP_CHOICES``, ``DEFAULT_BUSINESS_KEY``, ``SCHEDULE_NAME``: the pattern of a name); the
  writes, each locking the schedule's row (``schedule_lock``) first: ``schedule_create``,
  ``schedule_pause``, ``schedule_resume``, ``schedule_trigger``, ``schedule_backfill``,
  ``schedule_delete``; ``backfill_preview`` (``BackfillItem``s) and ``next_fire_times``.
"""

from __future__ import annotations

from sagas.compensation import compensation_preview, compensation_start
from sagas.pausing import (
    run_is_paused,
    run_pause,
    run_pause_info,
    run_resume,
    workflow_pause,
    workflow_pause_of,
    workflow_resume,
)
from sagas.repair import REDRIVABLE_REASONS, fork_plan, movable_versions, run_fork, run_move, run_redrive
from sagas.replay.check import check_run, definition_for, replay_check, runs_to_check
from sagas.replay.context import shutdown_requested
from sagas.replay.continuation import CONTINUED_AS_NEW, chain_place
from sagas.retention.archiving import ArchivedBatch, runs_archived
from sagas.retention.store import run_lines, store_for_location
from sagas.runtime.queue import compensation_queue_name, get_queue, redis_connection
from sagas.schedules.firing import next_fire_times
from sagas.schedules.services import (
    BackfillItem,
    backfill_preview,
    schedule_backfill,
    schedule_create,
    schedule_delete,
    schedule_lock,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)
from sagas.schedules.spec import CATCH_UP_CHOICES, DEFAULT_BUSINESS_KEY, OVERLAP_CHOICES, ScheduleSpec
from sagas.schedules.spec import NAME as SCHEDULE_NAME
from sagas.services import run_cancel, run_retry
from sagas.store.counts import in_flight_counts, run_counts
from sagas.store.key_grams import EXACT_UP_TO as KEY_GRAMS_EXACT_UP_TO
from sagas.store.key_grams import SHORTEST as KEY_GRAMS_SHORTEST
from sagas.store.key_grams import key_holds_grams
from sagas.store.locks import approval_lock, effect_lock, run_lock
from sagas.summaries import ERROR_KEY
from sagas.tracing import trace_headers, trace_id_hex, trace_url
from sagas.validation import MAX_COST, SIGNAL_NAME_CHARS, checked_text
from sagas.waits import approval_decide, signal_send

__all__ = [
    "CATCH_UP_CHOICES",
    "CONTINUED_AS_NEW",
    "DEFAULT_BUSINESS_KEY",
    "ERROR_KEY",
    "KEY_GRAMS_EXACT_UP_TO",
    "KEY_GRAMS_SHORTEST",
    "MAX_COST",
    "OVERLAP_CHOICES",
    "REDRIVABLE_REASONS",
    "SCHEDULE_NAME",
    "SIGNAL_NAME_CHARS",
    "ArchivedBatch",
    "BackfillItem",
    "ScheduleSpec",
    "approval_decide",
    "approval_lock",
    "backfill_preview",
    "chain_place",
    "check_run",
    "checked_text",
    "compensation_preview",
    "compensation_queue_name",
    "compensation_start",
    "definition_for",
    "effect_lock",
    "fork_plan",
    "get_queue",
    "in_flight_counts",
    "key_holds_grams",
    "movable_versions",
    "next_fire_times",
    "redis_connection",
    "replay_check",
    "run_cancel",
    "run_counts",
    "run_fork",
    "run_is_paused",
    "run_lines",
    "run_lock",
    "run_move",
    "run_pause",
    "run_pause_info",
    "run_redrive",
    "run_resume",
    "run_retry",
    "runs_archived",
    "runs_to_check",
    "schedule_backfill",
    "schedule_create",
    "schedule_delete",
    "schedule_lock",
    "schedule_pause",
    "schedule_resume",
    "schedule_trigger",
    "shutdown_requested",
    "signal_send",
    "store_for_location",
    "trace_headers",
    "trace_id_hex",
    "trace_url",
    "workflow_pause",
    "workflow_pause_of",
    "workflow_resume",
]

"""The Prometheus collector behind ``/metrics`` (console/views/metrics.py): read from PostgreSQL
at scrape time, nothing counted by the engine on its hot path.

Gauges (the state now, a handful of index reads, no tenant labels):

* ``sagas_runs{status}``: runs by status; COMPLETED, CANCELLED and COMPENSATED (final, nearly
  every run) as recounted every ``FINAL_REFRESH`` seconds, the others on every scrape;
* ``sagas_attention_items{kind}`` and ``sagas_attention_oldest_age_seconds{kind}``: what needs a
  person, each kind a line of the overview's "Needs a person", counted by the same selector
  (``console.selectors.overview.queue_lines``) for every tenant: ``unknown_effects``,
  ``approvals``, ``failed_compensations``, ``version_mismatch``, ``budget_exceeded``, ``model_unavailable``,
  ``non_determinism``, ``failed_runs``; and ``sagas_failed_runs{reason}``, the FAILED runs by why;
* ``sagas_workers_live``, ``sagas_workers_silent``: the worker registry (silent: never stopped,
  no beat within the liveness window, but one within ``SILENT_WINDOW``, as the workers page);
* ``sagas_metrics_scrape_seconds``: what this scrape cost.

Counters, from the journal (append-only: a database trigger refuses UPDATE and DELETE), read
incrementally by its monotonically increasing ``id``: each scrape reads only the entries added
since the previous one (a primary-key range scan, however long the journal is), adds them to
running totals, and keeps the totals and the position in Redis (``JournalTotals``), shared by
every console process. Redis holds a cache of a derivation, never the truth: if it is flushed,
the totals restart at 0 from the journal's end (a counter reset, which ``rate()`` handles).

* ``sagas_steps_total{outcome}``: ``step`` entries, ``succeeded`` or ``failed`` (the step raised);
* ``sagas_effects_total{kind, outcome}``: ledger outcomes journaled for effects and compensations:
  ``succeeded``, ``failed`` (final), ``refused`` (key reused with another payload), ``unknown``
  (the run halted on an unknown outcome; resolved later, it is counted again under its outcome);
* ``sagas_dispatch_latency_seconds``: histogram of first claim minus creation, per run.

Entries are counted once they are ``SETTLE`` old: ids are taken in insertion order but
committed in commit order, so an entry younger than that may still have an uncommitted
neighbour below it. The engine's transactions last milliseconds; one open longer than
``SETTLE`` when the position passes it is not counted. A scrape reads at most ``BATCH`` entries;
after a long pause without scrapes the counters catch up over several.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any, cast

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from console.selectors.overview import queue_lines
from console.selectors.workers import SILENT_WINDOW
from core.storage import is_redis_error
from sagas.models import RunStatus
from sagas.selectors import worker_liveness

SETTLE = timedelta(seconds=5)
# Statuses no run leaves: counted every FINAL_REFRESH seconds (the other statuses, every scrape).
FINAL_STATUSES = (RunStatus.COMPLETED.value, RunStatus.CANCELLED.value, RunStatus.COMPENSATED.value)
FINAL_REFRESH = 600.0
BATCH = 500_000
# How long a scrape waits for another one advancing the totals before it serves their last
# stored state instead (well inside Prometheus's default 10 s scrape timeout).
LOCK_WAIT = 2.0
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
STEP_OUTCOMES = ("succeeded", "failed")
EFFECT_OUTCOMES = ("succeeded", "failed", "refused", "unknown")
EFFECT_KINDS = ("effect", "compensation")

# The entries counted, and the outcome each stands for. Effect outcomes come from the result
# entry's recorded status; an unknown one from the halt it caused.
_DELTA_SQL = """
SELECT CASE WHEN kind = 'step' THEN 'step'
            WHEN kind IN ('effect_result', 'effect_refused') THEN 'effect'
            WHEN kind = 'halted' AND payload->>'code' = 'effect_unknown' THEN 'effect'
            ELSE 'compensation' END AS family,
       CASE WHEN kind = 'step' THEN CASE WHEN payload ? 'error' THEN 'failed' ELSE 'succeeded' END
            WHEN kind IN ('effect_refused', 'compensation_refused') THEN 'refused'
            WHEN kind = 'halted' THEN 'unknown'
            WHEN payload->>'status' = 'SUCCEEDED' THEN 'succeeded'
            ELSE 'failed' END AS outcome,
       count(*)
  FROM sagas_journalentry
 WHERE id > %(lo)s AND id <= %(hi)s
   AND (kind IN ('step', 'effect_result', 'effect_refused', 'compensation_result', 'compensation_refused')
        OR (kind = 'halted' AND payload->>'code' IN ('effect_unknown', 'compensation_unknown')))
 GROUP BY 1, 2
"""

# Where the settled part of the journal ends, at most ``batch`` entries past ``lo``: just below the
# first entry younger than ``settle`` (a primary-key scan from ``lo`` that stops there), else
# the end of the journal. Aged by PostgreSQL's clock, the one that stamped ``created_at`` (the
# engine inserts ``now()``): a console host whose clock runs ahead would count unsettled entries.
_HI_SQL = """
SELECT LEAST(
    COALESCE((SELECT min(id) - 1 FROM sagas_journalentry
               WHERE id > %(lo)s AND id <= %(lo)s + %(batch)s AND created_at >= now() - %(settle)s),
             (SELECT max(id) FROM sagas_journalentry), 0),
    %(lo)s + %(batch)s)
"""

_LATENCY_SQL = """
SELECT count(*), coalesce(sum(latency), 0), {buckets}
  FROM (SELECT greatest(0, extract(epoch FROM j.created_at - r.created_at)) AS latency
          FROM sagas_journalentry j JOIN sagas_workflowrun r ON r.id = j.run_id
         WHERE j.id > %(lo)s AND j.id <= %(hi)s AND j.kind = 'claimed' AND j.payload->>'attempt' = '1') AS first_claims
"""


def _latency_sql() -> str:
    return _LATENCY_SQL.format(buckets=", ".join(f"count(*) FILTER (WHERE latency <= {b!r})" for b in LATENCY_BUCKETS))


@dataclass
class JournalTotals:
    """Running totals of the journal up to entry ``position`` (counted since ``since``)."""

    position: int
    since: float  # unix time the totals started from 0
    steps: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)  # "kind:outcome"
    latency_count: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    # Runs in the final statuses, counted at ``final_at`` (unix time; 0: never): see ``_final_counts``.
    final_counts: dict[str, int] = field(default_factory=dict)
    final_at: float = 0.0

    def dumps(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def loads(cls, text: bytes | str | None) -> JournalTotals | None:
        try:
            data = json.loads(text or "null")
            totals = cls(**data) if isinstance(data, dict) else None
        except (TypeError, ValueError):
            return None
        if totals is None or len(totals.latency_buckets) != len(LATENCY_BUCKETS):
            return None  # another layout (the buckets changed): start again
        return totals


def _one(sql: str, params: dict[str, Any]) -> tuple[Any, ...]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def _settled_end(lo: int, batch: int = BATCH) -> int:
    return int(_one(_HI_SQL, {"lo": lo, "batch": batch, "settle": SETTLE})[0])


def totals_advance(totals: JournalTotals | None, *, batch: int = BATCH) -> JournalTotals:
    """``totals`` moved to the end of the settled journal (at most ``batch`` entries on). None, or
    a position past the journal's end (another database behind the same key), starts again
    from 0 at the settled end."""
    end = int(_one("SELECT coalesce(max(id), 0) FROM sagas_journalentry", {})[0])
    if totals is None or totals.position > end:
        return JournalTotals(position=end, since=time.time())
    lo = totals.position
    hi = _settled_end(lo, batch)
    if hi <= lo:
        return totals
    with connection.cursor() as cur:
        cur.execute(_DELTA_SQL, {"lo": lo, "hi": hi})
        for family, outcome, n in cur.fetchall():
            if family == "step":
                totals.steps[outcome] = totals.steps.get(outcome, 0) + n
            else:
                key = f"{family}:{outcome}"
                totals.effects[key] = totals.effects.get(key, 0) + n
        cur.execute(_latency_sql(), {"lo": lo, "hi": hi})
        count, total, *buckets = cur.fetchone()
    totals.latency_count += count
    totals.latency_sum += float(total)
    totals.latency_buckets = [a + b for a, b in zip(totals.latency_buckets, buckets, strict=True)]
    totals.position = hi
    return totals


@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)


def totals_key() -> str:
    """Per database: two databases behind one Redis keep their own totals."""
    return f"console:metrics:journal:{connection.settings_dict['NAME']}"


def _final_counts(totals: JournalTotals) -> None:
    """Recount the runs in the final statuses (COMPLETED, CANCELLED, COMPENSATED) when the count
    is older than ``FINAL_REFRESH``. They are nearly every run, so counting them is a scan of the
    status index (about a second at 1,000,000 runs on the loaded 2-core machine): paid once per
    ``FINAL_REFRESH`` by one scrape, not by every scrape."""
    if time.time() - totals.final_at < FINAL_REFRESH:
        return
    with connection.cursor() as cur:
        cur.execute("SELECT status, count(*) FROM sagas_workflowrun WHERE status = ANY(%s) GROUP BY status",
                    [list(FINAL_STATUSES)])
        totals.final_counts = dict(cur.fetchall())
    totals.final_at = time.time()


def _stored(conn: redis.Redis, key: str) -> bytes | None:
    # redis-py types its commands for the sync and asyncio clients at once; this one is sync.
    return cast("bytes | None", conn.get(key))


def journal_totals() -> JournalTotals | None:
    """The shared running totals, advanced to now, with the final statuses' counts; None when
    Redis does not answer (the counters and those counts are then left out of the scrape, not
    reported as 0). While another scrape advances them for longer than ``LOCK_WAIT`` (a
    catch-up after a pause), the totals it last stored: still counters, only not advanced."""
    conn, key = _redis(settings.REDIS_URL), totals_key()
    try:
        try:
            with conn.lock(f"{key}:lock", timeout=30, blocking_timeout=LOCK_WAIT):
                totals = totals_advance(JournalTotals.loads(_stored(conn, key)))
                _final_counts(totals)
                conn.set(key, totals.dumps())
                return totals
        except redis.exceptions.LockError:
            return JournalTotals.loads(_stored(conn, key))
    except Exception as exc:
        if is_redis_error(exc):
            return None
        raise


class SagaCollector(Collector):
    """Every metric of the module's docstring, read when Prometheus scrapes."""

    def collect(self) -> Iterator[Any]:
        started = time.monotonic()
        totals = journal_totals()
        yield from self._runs(totals)
        yield from self._attention()
        yield from self._workers()
        if totals is not None:
            yield from self._counters(totals)
        up = GaugeMetricFamily("sagas_metrics_counters_available",
                               "1 if the journal counters are in this scrape (0: Redis did not answer)")
        up.add_metric([], 1 if totals is not None else 0)
        yield up
        took = GaugeMetricFamily("sagas_metrics_scrape_seconds", "Time this scrape took to read PostgreSQL and Redis")
        took.add_metric([], time.monotonic() - started)
        yield took

    def _runs(self, totals: JournalTotals | None) -> Iterator[Any]:
        """Every status a run can still leave, counted now (index range scans over runs in flight
        and FAILED ones); the final statuses as last counted (``_final_counts``)."""
        current = [s for s in RunStatus.values if s not in FINAL_STATUSES]
        with connection.cursor() as cur:
            cur.execute("SELECT status, count(*) FROM sagas_workflowrun WHERE status = ANY(%s) GROUP BY status",
                        [current])
            counts = dict(cur.fetchall())
        runs = GaugeMetricFamily("sagas_runs", "Workflow runs by status (COMPLETED, CANCELLED and COMPENSATED "
                                 f"recounted every {FINAL_REFRESH:g} s)", labels=["status"])
        for status in RunStatus.values:
            if status not in FINAL_STATUSES:
                runs.add_metric([status], counts.get(status, 0))
            elif totals is not None:
                runs.add_metric([status], totals.final_counts.get(status, 0))
        yield runs

    def _attention(self) -> Iterator[Any]:
        # Prometheus is no user: counted as someone who sees every tenant (an unsaved superuser).
        lines = queue_lines(user=get_user_model()(username="metrics", is_superuser=True))
        items = GaugeMetricFamily("sagas_attention_items", "Items that need a person, by kind (the overview's lines)",
                                  labels=["kind"])
        age = GaugeMetricFamily("sagas_attention_oldest_age_seconds",
                                "How long the oldest item of each kind has waited (0 when there is none)",
                                labels=["kind"])
        failed = GaugeMetricFamily("sagas_failed_runs", "FAILED runs by the reason they failed for",
                                   labels=["reason"])
        for line in lines:
            kind, _, reason = line.key.partition(":")
            if reason:
                failed.add_metric([reason], line.count)
                continue
            items.add_metric([kind], line.count)
            age.add_metric([kind], max(0.0, line.age or 0.0))
        yield items
        yield age
        yield failed

    def _workers(self) -> Iterator[Any]:
        """Silent as the workers page lists them: within ``SILENT_WINDOW``. The registry keeps a
        killed worker's row forever (named ``host:pid``, rarely reused), so counting every one
        would only ever grow, and an alert on it would never clear."""
        now = timezone.now()
        live, silent = _one(
            "SELECT count(*) FILTER (WHERE last_seen_at >= %(cutoff)s),"
            " count(*) FILTER (WHERE last_seen_at < %(cutoff)s AND last_seen_at >= %(silent_since)s)"
            " FROM sagas_workerprocess WHERE stopped_at IS NULL",
            {"cutoff": now - worker_liveness(), "silent_since": now - SILENT_WINDOW})
        for name, value, doc in (
            ("sagas_workers_live", live, "Workers that beat within the liveness window"),
            ("sagas_workers_silent", silent, "Workers never stopped that no longer beat (killed, hung, cut off), "
             f"silent for under {SILENT_WINDOW.total_seconds() / 3600:g} h"),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge

    def _counters(self, totals: JournalTotals) -> Iterator[Any]:
        steps = CounterMetricFamily("sagas_steps", "Workflow steps journaled, by outcome", labels=["outcome"],
                                    created=totals.since)
        for outcome in STEP_OUTCOMES:
            steps.add_metric([outcome], totals.steps.get(outcome, 0), created=totals.since)
        yield steps
        effects = CounterMetricFamily("sagas_effects", "Effect and compensation outcomes journaled",
                                      labels=["kind", "outcome"], created=totals.since)
        for kind in EFFECT_KINDS:
            for outcome in EFFECT_OUTCOMES:
                effects.add_metric([kind, outcome], totals.effects.get(f"{kind}:{outcome}", 0), created=totals.since)
        yield effects
        latency = HistogramMetricFamily("sagas_dispatch_latency_seconds",
                                        "Time from a run's creation to its first claim by a worker")
        buckets = [(repr(b), n) for b, n in zip(LATENCY_BUCKETS, totals.latency_buckets, strict=True)]
        latency.add_metric([], [*buckets, ("+Inf", totals.latency_count)], totals.latency_sum)
        yield latency

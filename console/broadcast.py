"""Publishing live updates: ``broadcast(*topics)`` from any process, after commit.

Topics (console/topics.py): ``runs`` (any run changed), ``run.<uuid>`` (that run),
``effects``, ``approvals``, ``audit``, ``overview``, ``connectors`` (flow control). Each topic is a channel-layer group
(``live.<topic>``); the consumer (console/consumers.py) joins the groups its page's
fragments follow (console/live.py) and re-renders them when an event arrives.

Guarantees:

* nothing is published for a transaction that rolls back: inside ``atomic()`` the
  topics wait for the commit;
* ``broadcast`` never blocks on Redis and never raises into its caller. It adds the
  topics to this process's pending set; one background thread per process publishes
  them. If Redis is down the batch is logged and dropped (pages catch up on their next
  event or reconnect: a new connection always gets a fresh render);
* bursts coalesce: while a batch is being published, new topics accumulate and go out
  once in the next batch, and batches are at least ``MIN_INTERVAL`` apart. A process
  publishes each topic at most ``1 / MIN_INTERVAL`` times per second, whatever its
  throughput. Every topic is sent, heard or not: the channel layer's API cannot tell
  whether a group has members, and a send to an empty group costs Redis two short
  commands (about 0.1 ms of this process's CPU per topic).

Not guaranteed: delivery. An event is a hint to look again, not a record; PostgreSQL
stays the truth and every push is a fresh render from it.

The receivers at the bottom turn engine and ledger signals (which know nothing of
pages) into topics; ``connect_signals`` (called by the app's ``ready``) connects them.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from django.db import connection, transaction
from django.db.models.signals import post_save

from console.topics import (
    APPROVALS,
    AUDIT,
    CONNECTORS,
    EFFECTS,
    EVENT_TYPE,
    OVERVIEW,
    RUNS,
    group_for,
    is_topic,
    run_topic,
)
from ledger.signals import circuit_changed, effect_changed
from operators.models import AuditEntry
from operators.services.dual_rules import dual_changed
from sagas.events import run_changed

log = logging.getLogger("console.live")


def broadcast(*topics: str) -> None:
    """Tell open pages that the data behind ``topics`` changed (after commit). Never raises."""
    try:
        valid = [t for t in topics if is_topic(t)]
        if len(valid) != len(topics):
            log.warning("ignoring unknown live topics: %s", sorted(set(topics) - set(valid)))
        if not valid:
            return
        if connection.in_atomic_block:
            transaction.on_commit(lambda: publisher.put(valid), robust=True)
        else:
            publisher.put(valid)
    except Exception:  # a live page is never worth failing a write for
        log.exception("could not queue live topics %s", topics)


class Publisher:
    """One background thread per process that publishes pending topics to the channel layer."""

    MIN_INTERVAL = 0.05  # seconds between two batches
    TIMEOUT = 2.0  # seconds a batch may take before it is abandoned
    RETRY_AFTER = 1.0  # seconds to wait after a failed batch
    MAX_PENDING = 10_000  # run topics beyond this are dropped while Redis is slow or down
    CHUNK = 50  # group sends in flight at once

    def __init__(self, make_layer: Callable[[], Any] | None = None) -> None:
        self.make_layer = make_layer or _make_layer  # a channel layer of its own, made on first use
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pending: dict[str, None] = {}  # an ordered set
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self.topics_out = 0  # topics taken off the pending set (each costs Redis work)
        self.sent = 0  # group sends made
        self.failed_batches = 0
        self.layer: Any = None  # created on first use, dropped after a failure

    def put(self, topics: list[str]) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread and loop are not ours
            self._reset()
        with self._lock:
            for topic in topics:
                if len(self._pending) >= self.MAX_PENDING and topic.startswith("run."):
                    continue
                self._pending[topic] = None
            self._idle.clear()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="console-live-publisher", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is published (or dropped). True if it was."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        down_since: float | None = None
        last = 0.0
        while True:
            self._wake.wait()
            pause = last + self.MIN_INTERVAL - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with self._lock:
                self._wake.clear()
                batch = list(self._pending)
                self._pending.clear()
                if not batch:
                    self._idle.set()
                    continue
            last = time.monotonic()
            layer = self.layer
            try:
                if layer is None:
                    layer = self.layer = self.make_layer()
                loop.run_until_complete(asyncio.wait_for(self._send(layer, batch), self.TIMEOUT))
            except Exception as exc:
                self.failed_batches += 1
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("live updates not published (%d topics), will retry with the next change: %r",
                                len(batch), exc)
                if layer is not None:
                    try:
                        loop.run_until_complete(asyncio.wait_for(layer.close_pools(), self.TIMEOUT))
                    except Exception:
                        pass
                self.layer = None
                time.sleep(self.RETRY_AFTER)
            else:
                if down_since is not None:
                    log.warning("live updates published again after %.1f s", time.monotonic() - down_since)
                    down_since = None
            with self._lock:
                if not self._pending:
                    self._idle.set()

    async def _send(self, layer: Any, batch: list[str]) -> None:
        self.topics_out += len(batch)
        for start in range(0, len(batch), self.CHUNK):
            chunk = batch[start:start + self.CHUNK]
            await asyncio.gather(*(layer.group_send(group_for(t), {"type": EVENT_TYPE, "topic": t}) for t in chunk))
            self.sent += len(chunk)


def _make_layer() -> Any:
    """A channel layer of our own (its own connections, on the publisher's event loop)."""
    return channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)


publisher = Publisher()


@atexit.register
def _flush_at_exit() -> None:
    if publisher._pid == os.getpid() and publisher._thread is not None:
        publisher.flush(timeout=1.0)


# --- which topics a change concerns ---------------------------------------------------

# Run changes after which the approvals inbox may differ: a run started waiting (a new
# approval), a decision, or a run that left (approvals expired, escalated, rejected).
_APPROVAL_CAUSES = frozenset({
    "waiting", "needs_attention", "failed", "approval_decided", "cancelled", "compensation_started",
})


def topics_for_run(run_id: str, status: str, cause: str) -> list[str]:
    if cause == "progress":  # the history grew; lists and counts did not change
        return [run_topic(run_id)]
    topics = [RUNS, run_topic(run_id), OVERVIEW]
    if cause in _APPROVAL_CAUSES or status == "WAITING":
        topics.append(APPROVALS)
    if cause == "effect_resolved":
        topics.append(EFFECTS)
    return topics


def topics_for_effect(run_id: str, status: str, previous: str) -> list[str]:
    topics = [run_topic(run_id)]
    moved = {status, previous}
    if moved & {"UNKNOWN", "IN_PROGRESS"}:  # the ambiguous-effects queue may differ
        topics.append(EFFECTS)
    if "UNKNOWN" in moved:  # the overview counts unknown effects
        topics.append(OVERVIEW)
    return topics


def _on_run_changed(sender: Any, run_id: str, status: str, cause: str = "", **kwargs: Any) -> None:
    broadcast(*topics_for_run(run_id, status, cause))


def _on_effect_changed(sender: Any, run_id: str, status: str, previous: str = "", **kwargs: Any) -> None:
    broadcast(*topics_for_effect(run_id, status, previous))


def _on_audit(sender: Any, created: bool, instance: AuditEntry | None = None, **kwargs: Any) -> None:
    if created:
        # A connector's pause, resume or limits (from the console or the HTTP API) is audited in
        # the transaction that makes it: its entry is how the connectors page hears of it.
        if instance is not None and instance.object_type == "connector":
            broadcast(AUDIT, CONNECTORS)
        else:
            broadcast(AUDIT)


def _on_circuit_changed(sender: Any, **kwargs: Any) -> None:
    """A circuit opened, went half-open or closed. (Held calls let go publish nothing here: under
    load the pump lets some go every pass, and the connectors page polls for its counts; their
    runs hear of it through ``run_changed`` when they wake.)"""
    broadcast(CONNECTORS)


def connect_signals() -> None:
    """Publish live topics for engine, ledger and audit changes. Idempotent (dispatch_uid)."""
    run_changed.connect(_on_run_changed, dispatch_uid="console.live.run_changed")
    effect_changed.connect(_on_effect_changed, dispatch_uid="console.live.effect_changed")
    post_save.connect(_on_audit, sender=AuditEntry, dispatch_uid="console.live.audit")
    circuit_changed.connect(_on_circuit_changed, dispatch_uid="console.live.circuit_changed")
    dual_changed.connect(_on_dual_changed, dispatch_uid="console.live.dual_changed")


def _on_dual_changed(sender: Any, request: Any, **kwargs: Any) -> None:
    """A dual-control request was made or ended: the inbox beside the approvals looks again, and
    so does the page of the run it is about."""
    topics = [APPROVALS, OVERVIEW]
    if request.object_type == "run":
        topics.append(run_topic(request.object_id))
    broadcast(*topics)

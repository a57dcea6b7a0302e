"""A journal that went back in time: what the engine does when a failover lost commits.

With asynchronous replication a failover can lose the last commits the old primary
acknowledged. A worker that was advancing a run then finds, on the new primary, a journal
shorter than what it was told was written (``JournalCursor.append``: its next entry is numbered
at or below one already acknowledged), and raises ``JournalGap``. Replaying from that journal
would run the lost steps again and, worse, treat the lost effects as never asked for. So the run
stops for a person (NEEDS_ATTENTION, ``journal_gap``) and every effect the gap may hide is
recorded as UNKNOWN, under its own idempotency key:

* an intent journaled in the gap: its ledger record was committed with it, and is gone too; it
  is recorded again, UNKNOWN, from what the worker kept of it (``JournalCursor.intents``);
* any other record of the run still PENDING or IN_PROGRESS: its dispatch mark or outcome may
  have been in the gap; it becomes UNKNOWN.

A person then settles each UNKNOWN in the console (as for a timeout), and retries the run: the
replay asks each effect again under the same key, and the ledger's rules hold (a recorded
outcome is used, lookup or an idempotent re-send, else UNKNOWN again). Nothing in the gap is
ever taken as "not executed". With synchronous replication (docs/operations/failover.md) a
failover loses nothing acknowledged and no gap can occur.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from ledger.journal import KINDS
from ledger.models import EffectRecord, EffectStatus
from ledger.services import effect_transition
from sagas.errors import JournalGap

if TYPE_CHECKING:
    from sagas.replay.cursor import JournalCursor

log = logging.getLogger("sagas.gaps")

OPEN = (EffectStatus.PENDING, EffectStatus.IN_PROGRESS)
LOST_SHOWN = 200


def record_gap(cursor: JournalCursor, gap: JournalGap) -> list[dict[str, Any]]:
    """Record every effect ``gap`` may hide as UNKNOWN (see the module); the effects, for the
    run's halt details. One transaction. Keeps the newest ``LOST_SHOWN`` of the gap's lost
    entries in its details (``lost_count``: all of them)."""
    lost = {(entry["kind"], entry["name"]) for entry in gap.details.get("lost", [])}
    effects: list[dict[str, Any]] = []
    now = timezone.now()
    with transaction.atomic():
        for key, fields in cursor.intents.items():
            if (KINDS[fields["kind"]].intent, fields["step_name"]) not in lost:
                continue
            if EffectRecord.objects.filter(tenant=cursor.tenant, idempotency_key=key).exists():
                continue  # still there (recorded again by a replay): the open ones are taken below
            EffectRecord.objects.create(
                tenant=cursor.tenant, idempotency_key=key, run_id=cursor.run_id, step_name=fields["step_name"],
                kind=fields["kind"], connector=fields["connector"], request_payload=fields["request_payload"],
                payload_hash=fields["payload_hash"], flow_key=fields["flow_key"], status=EffectStatus.UNKNOWN,
                intent_at=now, error_class=type(gap).__name__, error_message=gap.message[:4000],
            )
            effects.append({"key": key, "name": fields["step_name"], "connector": fields["connector"],
                            "was": "lost with its intent"})
        for effect in EffectRecord.objects.select_for_update().filter(run_id=cursor.run_id, status__in=OPEN):
            was = effect.status
            effect_transition(effect, EffectStatus.UNKNOWN, error=gap)
            effects.append({"key": effect.idempotency_key, "name": effect.step_name, "connector": effect.connector,
                            "was": was})
    # The run's error and its halted entry list the newest lost entries, not a long run's thousands.
    entries = gap.details.get("lost", [])
    gap.details["lost"], gap.details["lost_count"] = entries[-LOST_SHOWN:], len(entries)
    log.error("run %s: %s; effects now UNKNOWN: %s", cursor.run_id, gap.message,
              ", ".join(e["key"] for e in effects) or "none")
    return effects

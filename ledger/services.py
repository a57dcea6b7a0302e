"""Writes on the ledger. Each runs inside the caller's transaction where it has one.

Resolution (automatic by lookup, or manual by a person with evidence) sends two
signals inside its transaction: ``effect_resolving`` before it locks the effect's row,
so that whoever owns the run (the sagas engine) locks the run first (one lock order
for every writer: run, then effect) and may refuse; and ``effect_resolved`` after the
change, so the owner journals it and wakes the run in the same commit. The ledger
itself knows nothing of runs beyond their id.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import OperationalError, transaction
from django.dispatch import Signal
from django.utils import timezone

from ledger.connectors import get_connector
from ledger.errors import AlreadyResolved, ConnectorNotRegistered, InvalidResolution
from ledger.models import EffectRecord, EffectStatus, check_effect_transition
from ledger.signals import send_effect_changed
from ledger.storable import json_storable, text_storable

# Sent inside the resolving transaction before the effect's row is locked: effect_id.
# A receiver locks what must be locked before the effect (its run) and may refuse the
# resolution by raising a LedgerError; nothing is changed then.
effect_resolving = Signal()
# Sent inside the resolving transaction: effect (EffectRecord, already saved),
# outcome ("succeeded" | "not_executed" | "failed"), actor (a label).
effect_resolved = Signal()

RESOLUTION_OUTCOMES = ("succeeded", "not_executed", "failed")
EVIDENCE_CHARS = 4000  # a resolution's note, as the console caps it


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def payload_hash(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def effect_transition(
    effect: EffectRecord,
    status: str,
    *,
    result: Any = None,
    downstream_ref: str = "",
    error: BaseException | None = None,
    dispatched: bool = False,
    next_check_in: float | None = None,
    throttled: bool = False,
) -> EffectRecord:
    """Move ``effect`` to ``status`` (checked against the transition table) and save it."""
    check_effect_transition(effect.status, status)
    previous = effect.status
    now = timezone.now()
    fields = ["status", "updated_at"]
    effect.status = status
    if dispatched:
        effect.attempts += 1
        effect.dispatched_at = now
        fields += ["attempts", "dispatched_at"]
    if throttled:  # the provider refused the last dispatch for its rate limit (``ledger.errors.Throttled``)
        effect.throttled += 1
        fields += ["throttled"]
    if status == EffectStatus.SUCCEEDED:
        effect.result, effect.downstream_ref, effect.completed_at = result, downstream_ref, now
        effect.next_check_at = None
        fields += ["result", "downstream_ref", "completed_at", "next_check_at"]
    if status == EffectStatus.FAILED_FINAL:
        effect.completed_at = now
        effect.next_check_at = None
        fields += ["completed_at", "next_check_at"]
    if error is not None:
        effect.error_class = type(error).__name__
        effect.error_message = str(error)[:4000]
        fields += ["error_class", "error_message"]
    if status == EffectStatus.UNKNOWN:
        effect.next_check_at = now + timedelta(seconds=next_check_in) if next_check_in is not None else None
        fields += ["next_check_at"]
    effect.save(update_fields=fields)
    if previous != status:
        send_effect_changed(effect_id=effect.id, run_id=effect.run_id, status=status, previous=previous)
    return effect


def effect_row_lock(*, effect_id: int) -> EffectRecord:
    """Lock an effect's row for a resolution, without waiting for it.

    Only a worker settling the effect holds that row for long enough to be met here, and it
    may be about to wait for a lock the caller already holds (the run's): waiting would risk a
    deadlock, so this refuses with ``InvalidResolution`` instead. ``EffectRecord.DoesNotExist``
    if there is no such effect.
    """
    try:
        with transaction.atomic():
            return EffectRecord.objects.select_for_update(nowait=True).get(id=effect_id)
    except OperationalError:
        raise InvalidResolution(
            f"effect #{effect_id}: a worker is recording its outcome at this moment; look again in a few seconds"
        ) from None


def effect_resolve(
    *,
    effect_id: int,
    outcome: str,
    note: str,
    user: User | None,
    actor: str = "",
    downstream_ref: str = "",
    result: dict[str, Any] | None = None,
    resolution: str = "manual",
) -> EffectRecord:
    """Record what happened to an UNKNOWN (or stuck IN_PROGRESS) effect, with evidence.

    ``outcome`` is ``succeeded`` (with the downstream reference), ``not_executed``
    (confirmed: it will be retried with the same key) or ``failed``. A second
    resolution is refused with who resolved it and when. ``effect_resolving`` receivers run
    first, before the effect's row is locked (see the module's docstring).
    """
    if outcome not in RESOLUTION_OUTCOMES:
        raise InvalidResolution(f"outcome must be one of {', '.join(RESOLUTION_OUTCOMES)}, not {outcome!r}")
    try:  # evidence PostgreSQL can store (no NUL), within the console's caps
        text_storable(note or "", what="the note", max_length=EVIDENCE_CHARS)
        text_storable(downstream_ref, what="the downstream reference", max_length=300, one_line=True)
        if result is not None:
            result = json.loads(json_storable(result, what="the result"))
    except ValueError as exc:
        raise InvalidResolution(str(exc)) from None
    note = (note or "").strip()
    if resolution == "manual" and not note:
        raise InvalidResolution("a note with the evidence is required")
    if outcome == "succeeded" and resolution == "manual" and not downstream_ref.strip():
        raise InvalidResolution("a succeeded resolution needs the downstream reference as evidence")
    label = actor or (user.get_username() if user is not None else "system")
    with transaction.atomic():
        effect_resolving.send(sender=EffectRecord, effect_id=effect_id)
        effect = effect_row_lock(effect_id=effect_id)
        if effect.status not in (EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS):
            if effect.resolved_at:
                raise AlreadyResolved(
                    f"already resolved by {effect.resolved_by_label} at {effect.resolved_at:%Y-%m-%d %H:%M:%S} UTC "
                    f"({effect.resolution}: {effect.status})"
                )
            raise AlreadyResolved(f"its outcome is already known: {effect.status}")
        if outcome == "succeeded":
            ref = downstream_ref.strip()
            if result is None:
                try:
                    result = get_connector(effect.connector).manual_result(ref)
                except ConnectorNotRegistered:
                    result = {"id": ref, "downstream_ref": ref, "resolved_manually": True}
            effect_transition(effect, EffectStatus.SUCCEEDED, result=result, downstream_ref=ref)
        elif outcome == "failed":
            effect_transition(effect, EffectStatus.FAILED_FINAL, error=InvalidResolution(note or "marked failed"))
        else:
            effect_transition(effect, EffectStatus.PENDING)
        effect.resolved_by = user
        effect.resolved_by_label = label
        effect.resolution = resolution
        effect.resolution_note = note
        effect.resolved_at = timezone.now()
        effect.save(update_fields=["resolved_by", "resolved_by_label", "resolution", "resolution_note", "resolved_at"])
        effect_resolved.send(sender=EffectRecord, effect=effect, outcome=outcome, actor=label)
    return effect

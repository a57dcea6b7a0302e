"""Reads of one stored value for the payload endpoint (console/views/payloads.py): a run's
input, result or error, a journal entry's payload, an effect's request, result or error message,
an approval's reason, an audit entry's before, after or reason.

Each read returns ``(found, value)``: ``found`` is False when the row does not exist (or is not
the given run's), so a stored ``None`` is told apart from a missing row. Only the one column is
read.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Manager, QuerySet

from ledger.models import EffectRecord
from operators.models import AuditEntry
from sagas.models import ApprovalRequest, JournalEntry, WorkflowRun

# kind -> (rows, column, key) for values that belong to a run, looked up by the item's id in ``key``
RUN_ITEM_FIELDS: dict[str, tuple[Manager[Any], str, str]] = {
    "entry": (JournalEntry.objects, "payload", "seq"),
    "effect-request": (EffectRecord.objects, "request_payload", "id"),
    "effect-result": (EffectRecord.objects, "result", "id"),
    "effect-error": (EffectRecord.objects, "error_message", "id"),
    "approval-reason": (ApprovalRequest.objects, "reason", "id"),
}
RUN_FIELDS = ("input", "result", "error")
AUDIT_FIELDS = ("before", "after", "reason")
TEXT_KINDS = frozenset({"effect-error", "approval-reason", "reason"})  # free text, not JSON
MAX_SEQ = 2**31 - 1  # PositiveIntegerField: a larger number names nothing (and must not reach SQL)
MAX_ID = 2**63 - 1  # BigAutoField


def _one(qs: QuerySet[Any], column: str) -> tuple[bool, Any]:
    rows = list(qs.values_list(column, flat=True)[:1])
    return (True, rows[0]) if rows else (False, None)


def run_value(run: WorkflowRun, kind: str) -> tuple[bool, Any]:
    if kind not in RUN_FIELDS:
        return False, None
    return _one(WorkflowRun.objects.filter(id=run.id), kind)


def run_item_value(run: WorkflowRun, kind: str, item_id: int) -> tuple[bool, Any]:
    if kind not in RUN_ITEM_FIELDS:
        return False, None
    rows, column, key = RUN_ITEM_FIELDS[kind]
    if not 0 <= item_id <= (MAX_SEQ if key == "seq" else MAX_ID):
        return False, None
    return _one(rows.filter(run_id=run.id, **{key: item_id}), column)


def audit_value(entries: QuerySet[AuditEntry], entry_id: int, kind: str) -> tuple[bool, Any]:
    """``entries``: the audit entries the user may see."""
    if kind not in AUDIT_FIELDS or not 0 <= entry_id <= MAX_ID:
        return False, None
    return _one(entries.filter(id=entry_id), kind)

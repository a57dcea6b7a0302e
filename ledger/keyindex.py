"""The key index of archived effects: deduplication outlives the effect records.

When retention archives a run, its settled effects (SUCCEEDED, FAILED_FINAL) leave one
compact ``EffectKeyIndex`` row each, in the same transaction that deletes their records
(``keys_keep``). Until the row expires, the intent path (``ledger.protocol``) finds the key
there when it is not in ``EffectRecord``: the same payload gets the recorded outcome and
nothing is executed; another payload is refused as a reused key. ``keys_purge`` drops expired
rows, in bounded batches. An expired row that is not purged yet is ignored already.

Runs with an effect whose outcome is open (IN_PROGRESS, UNKNOWN) are not archived
(``sagas.retention.archiving``), so the index never needs to stand for an open outcome. A PENDING
effect (never dispatched) leaves no key: a repeat may run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from ledger.models import EffectKeyIndex, EffectRecord, EffectStatus

KEPT_STATUSES = (EffectStatus.SUCCEEDED, EffectStatus.FAILED_FINAL)

_KEEP_SQL = """
INSERT INTO ledger_effectkeyindex (tenant, idempotency_key, kind, payload_hash, connector, status, result,
                                   downstream_ref, error_class, error_message, run_id, step_name, expires_at)
SELECT tenant, idempotency_key, kind, payload_hash, connector, status, result,
       downstream_ref, error_class, error_message, run_id, step_name, %s
  FROM ledger_effectrecord
 WHERE run_id = ANY(%s::uuid[]) AND status = ANY(%s)
ON CONFLICT (tenant, idempotency_key) DO UPDATE
   SET kind = EXCLUDED.kind, payload_hash = EXCLUDED.payload_hash, connector = EXCLUDED.connector,
       status = EXCLUDED.status, result = EXCLUDED.result, downstream_ref = EXCLUDED.downstream_ref,
       error_class = EXCLUDED.error_class, error_message = EXCLUDED.error_message,
       run_id = EXCLUDED.run_id, step_name = EXCLUDED.step_name, expires_at = EXCLUDED.expires_at
"""


def keys_keep(*, run_ids: Sequence[Any], expires_at: datetime) -> int:
    """Index the settled effects of ``run_ids`` until ``expires_at``; in the caller's
    transaction, before their records are deleted. Returns the number of keys indexed."""
    with connection.cursor() as cur:
        cur.execute(_KEEP_SQL, [expires_at, [str(r) for r in run_ids], list(KEPT_STATUSES)])
        return cur.rowcount


def keys_purge(*, now: datetime | None = None, limit: int = 10_000) -> int:
    """Delete up to ``limit`` expired keys; returns how many. Call again while it returns ``limit``."""
    with connection.cursor() as cur:
        cur.execute(
            """DELETE FROM ledger_effectkeyindex WHERE id IN (
                   SELECT id FROM ledger_effectkeyindex WHERE expires_at <= %s LIMIT %s)""",
            [now or timezone.now(), limit],
        )
        return cur.rowcount


def archived_effect(*, tenant: str, key: str) -> EffectRecord | None:
    """The archived effect of ``(tenant, key)`` as an unsaved, settled ``EffectRecord``
    (``pk`` None), if the key index holds it and it has not expired."""
    row = EffectKeyIndex.objects.filter(tenant=tenant, idempotency_key=key, expires_at__gt=timezone.now()).first()
    if row is None:
        return None
    return EffectRecord(
        tenant=row.tenant, idempotency_key=row.idempotency_key, kind=row.kind, run_id=row.run_id,
        step_name=row.step_name, connector=row.connector, request_payload=None, payload_hash=row.payload_hash,
        status=row.status, result=row.result, downstream_ref=row.downstream_ref, error_class=row.error_class,
        error_message=row.error_message, intent_at=row.expires_at,
    )

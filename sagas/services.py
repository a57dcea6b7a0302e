"""Writes on runs outside a worker's claim: starting runs, registering versions."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from sagas import queue, registry
from sagas.errors import NotSerializable, StartConflict
from sagas.models import JournalEntry, JournalKind, RunStatus, WorkflowRun, WorkflowVersion, check_transition
from sagas.systemdb import dumps

log = logging.getLogger("sagas.services")

_synced_versions: set[tuple[str, int, str]] = set()


def version_sync(*, definition: registry.WorkflowDefinition) -> None:
    """Record ``(name, version, hash)`` and its source; a no-op after the first call per process."""
    key = (definition.name, definition.version, definition.definition_hash)
    if key in _synced_versions:
        return
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO sagas_workflowversion
                   (name, version, definition_hash, source, module, first_registered_at, last_registered_at)
               VALUES (%s, %s, %s, %s, %s, now(), now())
               ON CONFLICT (name, version, definition_hash)
               DO UPDATE SET last_registered_at = now(), module = EXCLUDED.module""",
            [definition.name, definition.version, definition.definition_hash, definition.source, definition.module],
        )
    _synced_versions.add(key)


def versions_sync_all() -> int:
    definitions = registry.all_definitions()
    for definition in definitions:
        version_sync(definition=definition)
    return len(definitions)


def _json_roundtrip(value: Any, what: str) -> Any:
    try:
        return json.loads(dumps(value))
    except (TypeError, ValueError) as exc:
        raise NotSerializable(f"{what} is not JSON: {exc}") from None


def run_start(
    *,
    name: str,
    input: Any = None,
    business_key: str = "",
    tenant: str = "default",
    version: int | None = None,
    started_by: AbstractBaseUser | None = None,
    started_via: str = "api",
    max_steps: int | None = None,
    max_cost: float | None = None,
    max_duration: timedelta | None = None,
) -> WorkflowRun:
    """Create a PENDING run and wake a worker for it after commit.

    Idempotent per ``(tenant, name, business_key)``: starting again with the same
    input returns the existing run; with a different input raises
    ``StartConflict`` and creates nothing. Budgets default to the workflow's.
    """
    definition = registry.get(name, version)
    input = _json_roundtrip(input, "the run's input")
    if len(business_key) > 200:
        raise ValueError("business_key is longer than 200 characters")
    version_sync(definition=definition)
    budget_steps = max_steps if max_steps is not None else definition.max_steps
    budget_cost = max_cost if max_cost is not None else definition.max_cost
    budget_duration = max_duration if max_duration is not None else definition.max_duration
    try:
        with transaction.atomic():
            run = WorkflowRun.objects.create(
                workflow_name=definition.name,
                version=definition.version,
                definition_hash=definition.definition_hash,
                input=input,
                business_key=business_key,
                tenant=tenant,
                status=RunStatus.PENDING,
                last_seq=1,
                max_steps=budget_steps,
                max_cost=Decimal(str(budget_cost)) if budget_cost is not None else None,
                max_duration=budget_duration,
                started_by=started_by,
                started_via=started_via,
            )
            JournalEntry.objects.create(
                run=run,
                seq=1,
                kind=JournalKind.STARTED,
                payload={
                    "input": input,
                    "version": definition.version,
                    "definition_hash": definition.definition_hash,
                    "business_key": business_key,
                    "tenant": tenant,
                    "started_by": started_by.get_username() if started_by else None,
                    "started_via": started_via,
                },
                created_at=timezone.now(),
            )
            queue.enqueue_after_commit(run.id)
    except IntegrityError:
        if not business_key:
            raise
        existing = WorkflowRun.objects.get(tenant=tenant, workflow_name=definition.name, business_key=business_key)
        if existing.input != input:
            raise StartConflict(
                f"{definition.name} run {existing.id} already exists for business key {business_key!r} "
                f"(tenant {tenant!r}) with a different input; nothing was started"
            ) from None
        return existing
    return run


def runs_resume_stranded() -> list[str]:
    """Runs parked for ``version_mismatch`` whose exact (name, version, hash) this process
    now has registered go back to PENDING and are enqueued. Returns their ids."""
    resumed: list[str] = []
    for definition in registry.all_definitions():
        candidates = WorkflowRun.objects.filter(
            status=RunStatus.NEEDS_ATTENTION,
            status_reason="version_mismatch",
            workflow_name=definition.name,
            version=definition.version,
            definition_hash=definition.definition_hash,
        ).values_list("id", flat=True)
        for run_id in candidates:
            with transaction.atomic():
                run = WorkflowRun.objects.select_for_update().get(id=run_id)
                if run.status != RunStatus.NEEDS_ATTENTION or run.status_reason != "version_mismatch":
                    continue
                check_transition(run.status, RunStatus.PENDING)
                run.last_seq += 1
                JournalEntry.objects.create(
                    run=run,
                    seq=run.last_seq,
                    kind=JournalKind.RESUMED,
                    payload={"reason": "version re-registered", "definition_hash": definition.definition_hash},
                    created_at=timezone.now(),
                )
                run.status, run.status_reason, run.error = RunStatus.PENDING, "", None
                run.save(update_fields=["status", "status_reason", "error", "last_seq", "updated_at"])
                queue.enqueue_after_commit(run.id)
            resumed.append(str(run_id))
    if resumed:
        log.info("resumed %d run(s) stranded by a version mismatch", len(resumed))
    return resumed

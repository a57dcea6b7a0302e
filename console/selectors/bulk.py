"""Reads for bulk actions: which objects a batch would act on (the page's selection or its
filters, always narrowed to the user's tenants and to the objects the action can apply to), a
sample of them for the preview, and the batches a user may see."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import BigIntegerField, QuerySet, UUIDField
from django.db.models.functions import Cast

from console.forms import RunFilterForm
from console.forms_queues import EffectFilterForm
from console.models import BulkBatch, BulkItem, BulkOutcome
from ledger.models import EffectRecord
from operators.selectors.queues import approvals_open, effects_ambiguous
from operators.selectors.runs import runs_filtered
from operators.selectors.tenancy import User, tenants_of
from sagas.models import TERMINAL_STATUSES, ApprovalRequest, RunStatus, WorkflowRun, WorkflowVersion

SAMPLE_SIZE = 10
PROBLEMS_SHOWN = 50


class BadSelection(ValueError):
    """The selection or the filters cannot be read (HTTP 400); the message says why."""


@dataclass(frozen=True)
class BulkAction:
    """A bulk action: what it acts on, the single action it repeats per item (and whose role
    it needs), and how the pages name it."""

    name: str
    object_type: str  # run, effect, approval
    item_action: str  # a key of operators.roles.ACTION_ROLES
    label: str
    verb: str  # "cancelled", for "3 runs cancelled"

    @property
    def kind(self) -> str:
        """The list it starts from: runs, effects or approvals."""
        return f"{self.object_type}s"


ACTIONS: dict[str, BulkAction] = {a.name: a for a in (
    BulkAction("run.retry", "run", "run.retry", "Retry", "retried"),
    BulkAction("run.cancel", "run", "run.cancel", "Cancel", "cancelled"),
    BulkAction("run.cancel_compensate", "run", "run.cancel", "Cancel and compensate", "cancelled and compensated"),
    BulkAction("run.move", "run", "run.move", "Move to another version", "moved"),
    BulkAction("run.redrive", "run", "run.redrive", "Redrive", "redriven"),
    BulkAction("effect.resolve", "effect", "effect.resolve", "Resolve", "resolved"),
    BulkAction("approval.approve", "approval", "approval.approve", "Approve", "approved"),
    BulkAction("approval.reject", "approval", "approval.reject", "Reject", "rejected"),
)}

# Runs in these statuses can be acted on; the others are left out of a batch (a completed run
# cannot be cancelled; only a run that needs attention can be retried).
_RUN_STATES = {
    "run.retry": [RunStatus.NEEDS_ATTENTION],
    "run.cancel": [s for s in RunStatus.values if s not in TERMINAL_STATUSES and s != RunStatus.COMPENSATING],
}
_RUN_STATES["run.cancel_compensate"] = _RUN_STATES["run.cancel"]
# A move: a run that has not finished and no worker holds (each is re-checked when it is reached);
# a redrive: a FAILED run, or one parked for its code (sagas.repair says which reasons).
_RUN_STATES["run.move"] = [RunStatus.PENDING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION]
_RUN_STATES["run.redrive"] = [RunStatus.FAILED, RunStatus.NEEDS_ATTENTION]


def actions_for(kind: str) -> list[BulkAction]:
    return [a for a in ACTIONS.values() if a.kind == kind]


def filter_params(kind: str) -> tuple[str, ...]:
    """The query parameters of the list page ``kind`` that are its filters."""
    return {"runs": RunFilterForm.PARAMS, "effects": EffectFilterForm.PARAMS}.get(kind, ())


def _runs(action: BulkAction, user: User, filters: Mapping[str, str]) -> QuerySet[WorkflowRun]:
    form = RunFilterForm(filters)
    if not form.is_valid():
        raise BadSelection(" ".join(form.problems()))
    return runs_filtered(form.filters(), user=user).filter(status__in=_RUN_STATES[action.name])


def candidates(action: BulkAction, *, user: User, filters: Mapping[str, str]) -> QuerySet[Any]:
    """The objects of ``user``'s tenants that match the page's ``filters`` and that ``action``
    can apply to now (unordered)."""
    if action.object_type == "run":
        return _runs(action, user, filters)
    if action.object_type == "effect":
        form = EffectFilterForm(filters)
        if not form.filters_valid:
            raise BadSelection(" ".join(form.problems()))
        return effects_ambiguous(user=user, filters=form.filters())
    return approvals_open(user=user)


def _ids(action: BulkAction, ids: Iterable[str]) -> list[Any]:
    parsed: list[Any] = []
    for raw in ids:
        try:
            parsed.append(str(uuid.UUID(raw)) if action.object_type == "run" else int(raw))
        except (ValueError, TypeError, AttributeError, OverflowError):
            raise BadSelection(f"{str(raw)[:40]!r} is not a {action.object_type} id") from None
    return parsed


def matching(action: BulkAction, *, user: User, ids: Iterable[str] | None,
             filters: Mapping[str, str], limit: int | None = None) -> list[tuple[str, str, str]]:
    """``(object id, its state now, its tenant)`` of each object the batch would act on, in the list's
    order: the selected ``ids`` (those outside the user's tenants, or not in a state the action
    applies to, are left out), or everything matching ``filters`` when ``ids`` is None; the
    first ``limit`` of them only, when given."""
    qs = candidates(action, user=user, filters={} if ids is not None else filters)
    if ids is not None:
        qs = qs.filter(id__in=_ids(action, ids))
    state = {"run": "status", "effect": "status", "approval": "state"}[action.object_type]
    tenant = "run__tenant" if action.object_type == "approval" else "tenant"
    order = {"run": ("-created_at", "-id"), "effect": ("intent_at", "id"), "approval": ("deadline", "id")}
    rows = qs.order_by(*order[action.object_type]).values_list("id", state, tenant)[:limit]
    return [(str(pk), value, owner) for pk, value, owner in rows]


# --- batches -------------------------------------------------------------------------------


def batch_get(token: Any, *, user: User) -> BulkBatch | None:
    """The batch with ``token`` if ``user`` may see it: its author, or someone who sees every
    tenant (a batch may span tenants). None otherwise, as if there were none."""
    try:
        batch = BulkBatch.objects.filter(token=token).first()
    except (ValidationError, ValueError, TypeError):
        return None
    if batch is None or not user.is_authenticated:
        return None
    if batch.user_id == user.pk or tenants_of(user) is None:
        return batch
    return None


def batches_recent(*, user: User, limit: int = 50) -> list[BulkBatch]:
    """The newest confirmed batches ``user`` may see (``batch_get``'s rule)."""
    qs = BulkBatch.objects.exclude(state="draft")
    if tenants_of(user) is not None:
        qs = qs.filter(user_id=user.pk) if user.pk is not None else qs.none()
    return list(qs.order_by("-created_at", "-id")[:limit])


def batch_sample(batch: BulkBatch, action: BulkAction, *, size: int = SAMPLE_SIZE) -> list[Any]:
    """The batch's first ``size`` objects (runs, effects or approvals, with their runs)."""
    ids = list(batch.items.order_by("id").values_list("object_id", flat=True)[:size])
    if action.object_type == "run":
        found = WorkflowRun.objects.defer("input", "result").in_bulk(ids)
        return [found[uuid.UUID(i)] for i in ids if uuid.UUID(i) in found]
    if action.object_type == "effect":
        effects = EffectRecord.objects.in_bulk([int(i) for i in ids])
        runs = WorkflowRun.objects.defer("input", "result").in_bulk({e.run_id for e in effects.values()})
        for effect in effects.values():
            effect.bulk_run = runs.get(effect.run_id)  # type: ignore[attr-defined]  # for the template
        return [effects[int(i)] for i in ids if int(i) in effects]
    approvals = ApprovalRequest.objects.select_related("run", "run__started_by").in_bulk([int(i) for i in ids])
    return [approvals[int(i)] for i in ids if int(i) in approvals]


def batch_problems(batch: BulkBatch, *, limit: int = PROBLEMS_SHOWN) -> list[BulkItem]:
    """The first items that were refused or denied, with why."""
    return list(batch.items.filter(outcome__in=[BulkOutcome.REFUSED, BulkOutcome.DENIED]).order_by("id")[:limit])


def own_runs_among(batch: BulkBatch) -> int:
    """How many of an approval batch's approvals are of runs the batch's author started
    (four-eyes: each will be refused)."""
    ids = batch.items.values(approval_id=Cast("object_id", BigIntegerField()))  # a subquery: up to MAX_ITEMS ids
    return ApprovalRequest.objects.filter(id__in=ids, run__started_by_id=batch.user_id).count()


def batch_versions(batch: BulkBatch) -> list[int]:
    """The versions a move or redrive batch could go to: every version registered (the
    versions table) of the workflows its runs are of."""
    names = WorkflowRun.objects.filter(
        id__in=batch.items.values(run_id=Cast("object_id", UUIDField()))).values("workflow_name").distinct()
    return sorted(set(WorkflowVersion.objects.filter(name__in=names).values_list("version", flat=True)))

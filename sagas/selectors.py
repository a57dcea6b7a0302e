"""Reads on the engine's tables."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Max, QuerySet
from django.utils import timezone

from sagas.models import LEASED_STATUSES, JournalEntry, WorkerProcess, WorkflowRun


def worker_liveness() -> timedelta:
    """A worker that has not beaten for this long is presumed gone."""
    return timedelta(seconds=max(10.0, 5 * settings.SAGAS_SWEEP_INTERVAL))


def workers_live() -> QuerySet[WorkerProcess]:
    return WorkerProcess.objects.filter(
        stopped_at__isnull=True, last_seen_at__gte=timezone.now() - worker_liveness()
    )


def live_definition_hashes() -> set[str] | None:
    """Every definition hash some live worker can run; None when no worker is live at all
    (then nothing can be concluded about routing, and nothing is parked)."""
    rows = list(workers_live().values_list("definitions", flat=True))
    if not rows:
        return None
    return {d["hash"] for definitions in rows for d in definitions}


def run_newest_seq(run: WorkflowRun) -> int:
    """The seq of the run's newest journal entry, which is also how many it has (seqs are
    gap-free from 1). ``last_seq`` when no worker holds the run; a lease holder's steps are
    past ``last_seq`` until they are counted (``sagas.store.numbering``): one index lookup then."""
    if run.status not in LEASED_STATUSES:
        return run.last_seq
    newest = JournalEntry.objects.filter(run_id=run.id).aggregate(m=Max("seq"))["m"]
    return max(run.last_seq, newest or 0)

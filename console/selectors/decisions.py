"""What deciding an approval would set off, for the page that asks for the decision."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Count

from ledger.models import EffectKind, EffectRecord, EffectStatus


def effects_to_undo(run_ids: Iterable[Any]) -> dict[str, int]:
    """How many effects each run has completed (its SUCCEEDED forward effects): what a rejection,
    which fails the run and so compensates it, has to undo (irreversible ones are marked, not
    undone). One query; runs with none are left out."""
    rows = (EffectRecord.objects.filter(run_id__in=list(run_ids), kind=EffectKind.EFFECT,
                                        status=EffectStatus.SUCCEEDED)
            .values("run_id").annotate(n=Count("id")).order_by())
    return {str(r["run_id"]): r["n"] for r in rows}

from __future__ import annotations

from core.commands import PassLoopCommand
from ledger.reconcile import ReconcileReport, reconcile_due


class Command(PassLoopCommand):
    help = "Re-query UNKNOWN effects whose connector has a lookup, with back-off, and resolve them."
    label, stopped_label = "reconcile", "reconciler"

    def run_pass(self) -> tuple[ReconcileReport, bool]:
        report = reconcile_due()
        return report, bool(report.checked)

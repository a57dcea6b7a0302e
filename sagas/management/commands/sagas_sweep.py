from __future__ import annotations

from django.conf import settings

from core.commands import PassLoopCommand
from sagas.runtime import recovery


class Command(PassLoopCommand):
    help = "Re-enqueue runs whose lease expired or whose wake-up was lost. PostgreSQL is the truth."
    label, stopped_label = "sweep", "sweeper"

    def interval(self) -> float:
        return settings.SAGAS_SWEEP_INTERVAL

    def run_pass(self) -> tuple[recovery.SweepReport, bool]:
        report = recovery.sweep()
        return report, bool(report.total)

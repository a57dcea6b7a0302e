from __future__ import annotations

from django.conf import settings

from core.commands import PassLoopCommand
from sagas.runtime import recovery
from sagas.schedules import firing


class Command(PassLoopCommand):
    help = "Re-enqueue runs whose lease expired or whose wake-up was lost. PostgreSQL is the truth."
    label, stopped_label = "sweep", "sweeper"

    def interval(self) -> float:
        return settings.SAGAS_SWEEP_INTERVAL

    def wait_before_next(self, interval: float) -> float:
        """Sooner than the interval when a schedule's tick falls due before it (it fires on time)."""
        due = firing.seconds_until_due()
        return interval if due is None else max(0.05, min(interval, due + 0.01))

    def run_pass(self) -> tuple[recovery.SweepReport, bool]:
        report = recovery.sweep()
        return report, bool(report.total)

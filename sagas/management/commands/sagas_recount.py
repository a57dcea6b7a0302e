"""Count every run again, per tenant, status and reason (``sagas.store.counts``): only needed
after a load that bypassed the runs table's triggers (``session_replication_role = replica``).
Writers to the runs table wait for the count's duration."""

from __future__ import annotations

from typing import Any

from core.commands import NoPageCommand
from sagas.store import counts


class Command(NoPageCommand):
    help = "Count every run again per tenant, status and reason (after a load that bypassed the triggers)."

    def handle(self, *args: Any, **options: Any) -> None:
        counts.rebuild()
        total = sum(counts.run_counts().values())
        self.stdout.write(f"counted {total:,} run(s)")

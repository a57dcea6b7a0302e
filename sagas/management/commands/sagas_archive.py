"""Archive and delete the finished runs that are due now (``sagas.retention.archiving``), on demand.

Workers do this on their own every ``SAGAS_ARCHIVE_INTERVAL`` seconds; this command does one
whole pass now and prints what it did::

    manage.py sagas_archive                   # every due run, then purge expired effect keys
    manage.py sagas_archive --dry-run         # only count them
    manage.py sagas_archive --older-than 90   # runs finished over 90 days ago, whatever their workflow says
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from core.commands import NoPageCommand
from ledger.keyindex import keys_purge
from sagas.retention.archiving import archive_due, due_count


class Command(NoPageCommand):
    help = "Archive the finished runs past their retention to SAGAS_ARCHIVE_URL, then delete them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count the runs that are due; change nothing")
        parser.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                            help="archive runs finished more than DAYS ago, instead of each workflow's retention")
        parser.add_argument("--batch-size", type=int, default=None, help="runs per transaction (SAGAS_ARCHIVE_BATCH)")
        parser.add_argument("--pause", type=float, default=None, help="seconds between batches (SAGAS_ARCHIVE_PAUSE)")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than"]
        if days is not None and days < 0:
            raise CommandError("--older-than must be zero or more days")
        older_than = timedelta(days=days) if days is not None else None
        if options["dry_run"]:
            due = due_count(older_than=older_than)
            self.stdout.write(f"{due} run(s) due for archiving to {settings.SAGAS_ARCHIVE_URL}")
            return
        batch = options["batch_size"] or settings.SAGAS_ARCHIVE_BATCH
        if batch < 1:
            raise CommandError("--batch-size must be at least 1")
        pause = settings.SAGAS_ARCHIVE_PAUSE if options["pause"] is None else options["pause"]
        report = archive_due(batch_size=batch, pause=pause, older_than=older_than)
        purged = 0
        while done := keys_purge():
            purged += done
        self.stdout.write(f"{report}; purged {purged} expired effect key(s)")

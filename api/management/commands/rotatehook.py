"""``manage.py rotatehook NAME [--keep-old-hours N]``: give a hook a new Standard Webhooks secret
and print it once. This is how a hook made before Standard Webhooks moves to them; with
``--keep-old-hours`` the replaced secret (and its scheme: the legacy headers too) stays accepted
that long, so the sender can switch when it deploys."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from api.hooks import hook_rotate
from api.models import Hook
from core.webhooks import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome

ACTOR = system_label("rotatehook")
MAX_KEEP_HOURS = 24 * 30


class Command(BaseCommand):
    help = "Give a hook a new Standard Webhooks secret (printed once), keeping the old one accepted for a while."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the hook (POST /api/v1/hooks/NAME)")
        parser.add_argument("--keep-old-hours", type=float, default=0.0,
                            help="accept the replaced secret too for this many hours (default 0: refuse it now, "
                                 "as for a leaked secret; 24 gives a sender a day to switch)")

    def handle(self, *args: Any, **options: Any) -> None:
        hours = options["keep_old_hours"]
        if not 0 <= hours <= MAX_KEEP_HOURS:
            raise CommandError(f"--keep-old-hours must be between 0 and {MAX_KEEP_HOURS}")
        name = options["name"].strip()
        with transaction.atomic():
            was = Hook.objects.select_for_update().filter(name=name).values_list("signature_scheme", flat=True).first()
            try:
                hook, secret = hook_rotate(name=name, keep_old=timedelta(hours=hours))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            until = hook.overlap_until()
            AuditEntry.objects.create(
                actor=None, actor_label=ACTOR, action="hook.rotate", object_type="hook", object_id=hook.name,
                before={"signature_scheme": was},
                after={"secret": "rotated", "signature_scheme": hook.signature_scheme,
                       "old_secret_accepted_until": until.isoformat() if until else None},
                outcome=AuditOutcome.OK, tenant=hook.tenant,
            )
        self.stdout.write(f"Hook {hook.name}: a new secret, for Standard Webhooks ({ID_HEADER}, {TIMESTAMP_HEADER}, "
                          f"{SIGNATURE_HEADER}).")
        self.stdout.write(secret)
        self.stdout.write("Shown once. " + (f"The old secret is still accepted until {until:%Y-%m-%d %H:%M} UTC."
                                            if until else "The old secret is refused from now on."))

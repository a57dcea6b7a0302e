"""``manage.py createhook NAME --signal payment_settled [--workflow W] [--tenant T]``: make a
signed webhook (``POST /api/v1/hooks/NAME``) and print its Standard Webhooks secret once, for
the sender."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.text import slugify

from api.hooks import hook_create
from core.webhooks import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome

ACTOR = system_label("createhook")


class Command(BaseCommand):
    help = "Create a signed webhook that sends a signal to the run its body names; prints the secret once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="letters, digits, - and _: the URL is /api/v1/hooks/NAME")
        parser.add_argument("--signal", required=True, help="the signal it sends (what ctx.wait_for waits for)")
        parser.add_argument("--workflow", default="", help="only runs of this workflow (default: any)")
        parser.add_argument("--tenant", default="default", help="the tenant whose runs it reaches (default: default)")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name or slugify(name) != name or len(name) > 60:
            raise CommandError("NAME must be 1-60 lowercase letters, digits, '-' or '_'")
        tenant = options["tenant"].strip()
        if not tenant or len(tenant) > 100:
            raise CommandError("--tenant must be 1-100 characters")
        try:
            hook, secret = hook_create(name=name, signal=options["signal"], workflow=options["workflow"].strip(),
                                       tenant=tenant)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        AuditEntry.objects.create(
            actor=None, actor_label=ACTOR, action="hook.create", object_type="hook", object_id=hook.name,
            after={"state": "enabled", "signal": hook.signal, "workflow": hook.workflow, "tenant": hook.tenant},
            outcome=AuditOutcome.OK, tenant=hook.tenant,
        )
        scope = f"tenant {hook.tenant}" + (f", workflow {hook.workflow}" if hook.workflow else "")
        self.stdout.write(f"Hook {hook.name}: POST /api/v1/hooks/{hook.name} sends signal {hook.signal!r} to the "
                          f"run the body names ({scope}).")
        self.stdout.write(secret)
        self.stdout.write(f"Shown once. Sign each delivery with Standard Webhooks ({ID_HEADER}, {TIMESTAMP_HEADER}, "
                          f"{SIGNATURE_HEADER}), e.g. Webhook(secret).sign(msg_id, timestamp, body) of the "
                          "standardwebhooks library.")

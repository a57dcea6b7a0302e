"""``manage.py createapikey NAME --role operator [--tenant acme ...] [--expires-days N] [--rate N]``:
make an API key for a service account and print it once (only its hash is kept)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.text import slugify

from api.keys import apikey_create
from operators import roles
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome

ACTOR = system_label("createapikey")


class Command(BaseCommand):
    help = "Create an API key (printed once) for a service account with one console role."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="letters, digits, - and _ (the audit log names the key by it)")
        parser.add_argument("--role", choices=roles.ROLES, required=True)
        parser.add_argument("--tenant", action="append", default=None,
                            help="a tenant the key is limited to; repeat for several (default: every tenant)")
        parser.add_argument("--expires-days", type=int, default=None, help="the key stops working after N days")
        parser.add_argument("--rate", type=int, default=600, help="requests per minute (0: no limit; default 600)")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name or slugify(name) != name or len(name) > 60:
            raise CommandError("NAME must be 1-60 lowercase letters, digits, '-' or '_'")
        if options["rate"] < 0 or (options["expires_days"] is not None and options["expires_days"] < 1):
            raise CommandError("--rate must be at least 0 and --expires-days at least 1")
        expires = timezone.now() + timedelta(days=options["expires_days"]) if options["expires_days"] else None
        try:
            key, plain = apikey_create(name=name, role=options["role"], tenants=options["tenant"],
                                       expires_at=expires, rate_per_minute=options["rate"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        AuditEntry.objects.create(
            actor=None, actor_label=ACTOR, action="apikey.create", object_type="apikey", object_id=key.name,
            after={"state": key.state, "role": key.role, "tenants": options["tenant"], "expires_at":
                   expires.isoformat() if expires else None, "rate_per_minute": key.rate_per_minute},
            outcome=AuditOutcome.OK, tenant="",
        )
        self.stdout.write(f"API key {key.name} ({key.role}"
                          f"{', tenants ' + ', '.join(options['tenant']) if options['tenant'] else ''}):")
        self.stdout.write(plain)
        self.stdout.write("Shown once: only its hash is stored. Send it as 'Authorization: Bearer <key>'.")

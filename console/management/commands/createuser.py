from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from console import roles
from console.models import TenantScope


class Command(BaseCommand):
    help = "Create (or update) a console user with one or more roles: viewer, operator, approver."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=roles.ROLES, required=True,
                            help="repeat for several roles")
        parser.add_argument("--password", default=None,
                            help="checked by AUTH_PASSWORD_VALIDATORS; default: a random one, printed")
        parser.add_argument("--email", default="")
        parser.add_argument("--tenants", default=None,
                            help="comma-separated tenants the user is limited to (default: every tenant)")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        roles.ensure_groups()
        username = options["username"].strip()
        if not username:
            raise CommandError("the username cannot be empty")
        tenants = _tenants(options["tenants"])
        password = options["password"] or secrets.token_urlsafe(16)
        model = get_user_model()
        # Checked before anything is written, against the user as they would be (similarity to
        # the username and e-mail): a refused password creates and changes nothing.
        candidate = model.objects.filter(username=username).first() or model(username=username, email=options["email"])
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise CommandError(f"password refused, nothing was changed: {' '.join(exc.messages)}") from None
        user, created = model.objects.get_or_create(username=username, defaults={"email": options["email"]})
        user.set_password(password)
        user.save()
        user.groups.set(Group.objects.filter(name__in=options["role"]))
        if tenants is not None:
            TenantScope.objects.update_or_create(user=user, defaults={"tenants": tenants})
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({', '.join(sorted(options['role']))}"
            f"{'; tenants: ' + ', '.join(tenants) if tenants else ''}); "
            f"password: {password}"
        )


def _tenants(value: str | None) -> list[str] | None:
    if value is None:
        return None
    tenants = sorted({t.strip() for t in value.split(",") if t.strip()})
    if not tenants:
        raise CommandError("--tenants needs at least one tenant (leave it out for every tenant)")
    if any(len(t) > 100 or "\x00" in t for t in tenants):
        raise CommandError("a tenant is at most 100 characters, without NUL")
    return tenants

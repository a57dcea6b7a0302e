"""``manage.py createuser <name> --role <role> [--staff]``: create or update a console user.

``--staff`` opens the Django admin to them read-only: ``is_staff`` and the view permission of
every model, and no add, change or delete permission (the console's admin policy keeps the
engine's tables read-only for everyone anyway: console/admin.py). ``--no-staff`` takes that away;
without either, an existing user's staff status is left as it is. Managing users and roles in
the admin takes a superuser (``createsuperuser``).

The role change is audited (``user.roles``) as made by ``system: createuser``.
"""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from console.user_audit import role_changes
from operators import roles
from operators.actors import system_label
from operators.models import TenantScope

ACTOR = system_label("createuser")


class Command(BaseCommand):
    help = ("Create (or update) a console user with one or more roles: viewer, operator, approver; "
            "--staff: read-only access to the Django admin.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=roles.ROLES, required=True,
                            help="repeat for several roles")
        parser.add_argument("--password", default=None,
                            help="checked by AUTH_PASSWORD_VALIDATORS; default: a random one, printed")
        parser.add_argument("--email", default="")
        parser.add_argument("--tenants", default=None,
                            help="comma-separated tenants the user is limited to (default: every tenant)")
        parser.add_argument("--staff", action=argparse.BooleanOptionalAction, default=None,
                            help="--staff: may open the Django admin, read-only (view permissions only); "
                                 "--no-staff: may not; default: unchanged (not staff for a new user)")

    def handle(self, *args: Any, **options: Any) -> None:
        roles.ensure_groups()
        username = options["username"].strip()
        if not username:
            raise CommandError("the username cannot be empty")
        tenants = _tenants(options["tenants"])
        password = options["password"] or secrets.token_urlsafe(16)
        staff = options["staff"]
        model = get_user_model()
        # Checked before anything is written, against the user as they would be (similarity to
        # the username and e-mail): a refused password creates and changes nothing.
        candidate = model.objects.filter(username=username).first() or model(username=username, email=options["email"])
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise CommandError(f"password refused, nothing was changed: {' '.join(exc.messages)}") from None
        with transaction.atomic(), role_changes(label=ACTOR):
            user, created = model.objects.get_or_create(username=username, defaults={"email": options["email"]})
            user.set_password(password)
            if staff is not None:
                user.is_staff = staff
            user.save()
            user.groups.set(Group.objects.filter(name__in=options["role"]))
            if staff is not None:
                user.user_permissions.set(Permission.objects.filter(codename__startswith="view_") if staff else [])
            if tenants is not None:
                TenantScope.objects.update_or_create(user=user, defaults={"tenants": tenants})
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({', '.join(sorted(options['role']))}"
            f"{'; tenants: ' + ', '.join(tenants) if tenants else ''}"
            f"{'; staff (read-only admin)' if user.is_staff else ''}); "
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

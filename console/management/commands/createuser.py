from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from console import roles


class Command(BaseCommand):
    help = "Create (or update) a console user with one or more roles: viewer, operator, approver."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=roles.ROLES, required=True,
                            help="repeat for several roles")
        parser.add_argument("--password", default=None,
                            help="checked by AUTH_PASSWORD_VALIDATORS; default: a random one, printed")
        parser.add_argument("--email", default="")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        roles.ensure_groups()
        username = options["username"].strip()
        if not username:
            raise CommandError("the username cannot be empty")
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
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({', '.join(sorted(options['role']))}); "
            f"password: {password}"
        )

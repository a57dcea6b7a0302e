from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from console import roles


class Command(BaseCommand):
    help = "Create (or update) a console user with one or more roles: viewer, operator, approver."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=roles.ROLES, required=True,
                            help="repeat for several roles")
        parser.add_argument("--password", default=None, help="default: a random one, printed")
        parser.add_argument("--email", default="")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        roles.ensure_groups()
        username = options["username"].strip()
        if not username:
            raise CommandError("the username cannot be empty")
        password = options["password"] or secrets.token_urlsafe(12)
        user, created = get_user_model().objects.get_or_create(username=username, defaults={"email": options["email"]})
        user.set_password(password)
        user.save()
        user.groups.set(Group.objects.filter(name__in=options["role"]))
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({', '.join(sorted(options['role']))}); "
            f"password: {password}"
        )

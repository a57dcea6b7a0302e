"""Print, or apply, the grants of the least-privilege runtime role (``sagas.store.dbroles``).

Run it as the tables' owner (the ``DATABASE_URL`` that ``migrate`` uses), after every
``migrate``::

    manage.py db_roles --runtime-role saga_app            # prints the SQL
    manage.py db_roles --runtime-role saga_app --apply    # runs it, in one transaction
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connection, transaction

from core.commands import NoPageCommand
from sagas.store.dbroles import quote, role_problems, runtime_grants, schema_read


class Command(NoPageCommand):
    help = (
        "Print (or --apply) the grants of the runtime database role: no UPDATE, DELETE or TRUNCATE "
        "on the journal and the audit log, and no ownership. Run as the owner, after every migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runtime-role", required=True, help="the role web, workers and sweeper connect as")
        parser.add_argument("--apply", action="store_true", help="run the statements instead of printing them")

    def handle(self, *args: Any, **options: Any) -> None:
        role = options["runtime_role"]
        with connection.cursor() as cursor:
            schema = schema_read(cursor)
            if not schema.append_only:
                raise CommandError(
                    f"no append-only table in schema {schema.schema} of {schema.database}: run migrate first"
                )
            problems = role_problems(cursor, role=role, schema=schema)
        statements = runtime_grants(role=role, schema=schema)
        if not options["apply"]:
            self.stdout.write(
                f"-- runtime role {quote(role)} on database {quote(schema.database)}; run as the owner "
                f"{quote(schema.owner)} after every migrate\n"
                f"-- append-only (SELECT, INSERT only): {', '.join(schema.append_only)}"
            )
            for line in [*(f"-- WARNING: {p}" for p in problems), "BEGIN;", *(f"{s};" for s in statements), "COMMIT;"]:
                self.stdout.write(line)
            return
        if problems:
            raise CommandError("; ".join(problems))
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        self.stdout.write(
            f"runtime role {role}: SELECT and INSERT only on {', '.join(schema.append_only)}; "
            f"reads and writes on the other tables of {schema.schema}; owns nothing"
        )

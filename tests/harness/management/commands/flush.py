"""The test runner's flush, about a thousand times faster than Django's on this schema.

Django empties the database after every transactional test with one ``TRUNCATE`` of every
table, then recreates content types and permissions (``post_migrate``). On PostgreSQL a
TRUNCATE gives each table and index a new file, which took 1-2 s per test here; a ``DELETE``
of a table that holds a few rows takes microseconds. So, for the call Django's test case
makes (``reset_sequences=False``, not interactive), this deletes every row instead, with
triggers off for the transaction (``session_replication_role = replica``: the append-only
triggers and the foreign-key checks; needs a superuser, as the tests' role is), and keeps the
content types and permissions, which then need no recreating. Any other call (``manage.py
flush`` by hand, a non-superuser) is Django's own command.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import connections, transaction

# Rows Django's flush deletes and post_migrate writes back the same: kept instead.
KEPT = frozenset({"django_content_type", "auth_permission"})


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        database = options["database"]
        connection = connections[database]
        if options["interactive"] or options.get("reset_sequences", True) or options.get("allow_cascade", False) \
                or not _superuser(connection):
            return super().handle(**options)
        tables = [t for t in connection.introspection.django_table_names(only_existing=True, include_views=False)
                  if t not in KEPT]
        quote = connection.ops.quote_name
        with transaction.atomic(using=database), connection.cursor() as cur:
            cur.execute("SET LOCAL session_replication_role = replica")
            cur.execute("; ".join(f"DELETE FROM {quote(table)}" for table in tables))


def _superuser(connection: Any) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = cur.fetchone()
    return bool(row and row[0])

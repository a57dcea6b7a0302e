"""The test session's PostgreSQL backend: Django's, emptying the tables between transactional
tests with DELETE instead of TRUNCATE (config/settings_test.py names it; the processes the
tests start use Django's own).

pytest-django empties every table after each transactional test (``manage.py flush``), which
Django does with one ``TRUNCATE`` of all of them. TRUNCATE gives each of the ~40 tables, its
indexes and its TOAST table new files and syncs them at commit: 1-2 s per test on this 2-core
machine when other suites share its disk, for tables that hold a handful of rows. DELETE of a
few rows writes a few tuples. What is left is the same: sequences go on, as they do after
Django's TRUNCATE without RESTART IDENTITY; the content types and permissions, which
post_migrate would write again at once, are kept instead (no test makes or removes one), so
post_migrate only finds them there.

``session_replication_role = replica`` (for that transaction only) lets the rows go in any
order and past the journal's and audit log's append-only triggers (config/append_only.py),
as the TRUNCATE escape of settings_test did. Setting it takes a superuser (as the tests'
``postgres`` is); without one, the flush is Django's TRUNCATE.
"""

from __future__ import annotations

from django.db.backends.postgresql import base, operations


KEPT = frozenset({"django_content_type", "auth_permission"})


class DatabaseOperations(operations.DatabaseOperations):
    _may_replicate: bool | None = None

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or allow_cascade or not self._superuser():
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return ["SET LOCAL session_replication_role = replica"] + [
            f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))}"
            for table in tables if table not in KEPT
        ]

    def _superuser(self) -> bool:
        if DatabaseOperations._may_replicate is None:
            with self.connection.cursor() as cur:
                cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                row = cur.fetchone()
            DatabaseOperations._may_replicate = bool(row and row[0])
        return DatabaseOperations._may_replicate


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations

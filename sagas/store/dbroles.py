"""The least-privilege PostgreSQL role the processes connect as (``manage.py db_roles``).

Migrations run as the tables' owner. Web servers, workers and the sweeper connect as a
runtime role that owns nothing, so it cannot ALTER a table, disable its triggers or
TRUNCATE it (all of which need ownership or a TRUNCATE grant it never gets). Its grants:

* SELECT and INSERT only on the append-only tables (the journal, the audit log): every
  table that carries a ``BEFORE TRUNCATE`` trigger (``core.append_only``), found in the
  database itself, so a new append-only table is covered once its migration ran;
* SELECT only on ``django_migrations``;
* SELECT, INSERT, UPDATE, DELETE on every other table of the schema, and USAGE on its
  sequences;
* EXECUTE on ``sagas_archive_delete(uuid[])`` (migration 0012), retention's one way to delete
  archived runs with their journal: it runs as the owner and deletes only terminal runs that
  have an archive row, so the role gets no DELETE on the journal for it.

Nothing is granted by default privileges: a table created by a later migration is out of
the runtime role's reach (an error, not a silent UPDATE on a new append-only table) until
the grants are applied again, which is why ``db_roles --apply`` runs after every ``migrate``.
The statements are idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READ_ONLY_TABLES = ("django_migrations",)
ARCHIVE_DELETE_FUNCTION = "sagas_archive_delete"

_APPEND_ONLY_SQL = """
SELECT DISTINCT c.relname
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT t.tgisinternal AND (t.tgtype & 32) <> 0 AND n.nspname = current_schema()
 ORDER BY 1
"""  # tgtype bit 5 (32): the trigger fires on TRUNCATE


@dataclass(frozen=True)
class Schema:
    """What the grants are computed from: read from the database as the owner sees it."""

    database: str
    schema: str
    owner: str
    append_only: tuple[str, ...]


def quote(name: str) -> str:
    """A PostgreSQL identifier, double-quoted."""
    return '"' + name.replace('"', '""') + '"'


def schema_read(cursor: Any) -> Schema:
    cursor.execute("SELECT current_database(), current_schema(), current_user")
    database, schema, owner = cursor.fetchone()
    cursor.execute(_APPEND_ONLY_SQL)
    return Schema(database, schema, owner, tuple(row[0] for row in cursor.fetchall()))


def role_problems(cursor: Any, *, role: str, schema: Schema) -> list[str]:
    """What makes ``role`` unfit to be the runtime role: it does not exist, is the owner
    or a superuser, owns tables here, or is a member of the owner (inheriting its powers)."""
    if role == schema.owner:
        return [f"{role} is the role this command runs as (the owner that migrates), not a separate runtime role"]
    cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
    row = cursor.fetchone()
    if row is None:
        return [f"role {role} does not exist; create it first (CREATE ROLE {quote(role)} LOGIN PASSWORD '...')"]
    problems = []
    if row[0]:
        problems.append(f"{role} is a superuser: privileges do not bind it")
    cursor.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tableowner = %s", [schema.schema, role]
    )
    if cursor.fetchone()[0]:
        problems.append(
            f"{role} owns tables in schema {schema.schema}: an owner can alter, truncate and disable triggers"
        )
    cursor.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", [role, schema.owner])
    if cursor.fetchone()[0]:
        problems.append(f"{role} is a member of {schema.owner} and so holds its powers")
    return problems


def runtime_grants(*, role: str, schema: Schema) -> list[str]:
    """The statements that give ``role`` exactly the runtime privileges (see the module doc)."""
    r, s = quote(role), quote(schema.schema)
    qualified = ", ".join(f"{s}.{quote(t)}" for t in schema.append_only)
    read_only = ", ".join(f"{s}.{quote(t)}" for t in READ_ONLY_TABLES)
    return [
        f"REVOKE CREATE ON SCHEMA {s} FROM PUBLIC",
        f"REVOKE ALL ON SCHEMA {s} FROM {r}",
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT CONNECT ON DATABASE {quote(schema.database)} TO {r}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
        f"REVOKE INSERT, UPDATE, DELETE ON {read_only} FROM {r}",
        f"REVOKE UPDATE, DELETE ON {qualified} FROM {r}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {r}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
        f"GRANT EXECUTE ON FUNCTION {s}.{quote(ARCHIVE_DELETE_FUNCTION)}(uuid[]) TO {r}",
    ]

"""Hot-path statements sent straight through libpq: ``Statement``.

``sagas.store.systemdb`` runs its three per-run statements (the claim, a step's append, the finish)
this way. Each is prepared once per connection under its own name (``PQprepare``) and executed
with ``PQexecPrepared``, its parameters sent as text and its row read as PostgreSQL's text, which
the caller parses. psycopg's cursor spends about 100 µs of CPU per execute converting the query
and dumping each parameter, libpq about 20 (measured 2026-12-02; bench/README.md has the figures).
"""

from __future__ import annotations

import weakref
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg.types.string import TextLoader

_IDLE = psycopg.pq.TransactionStatus.IDLE
_OK = (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK)
_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE
_NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name: "prepared statement ... does not exist"
# What the cursor path reads as text, as the libpq path does.
_AS_TEXT = ("bool", "int2", "int4", "int8", "float4", "float8", "numeric", "uuid", "json", "jsonb", "date",
            "timestamp", "timestamptz", "interval")
# The names prepared on each connection, forgotten with the connection (Django opens a new one
# after a failure or past CONN_MAX_AGE, and it has none prepared).
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection, set[bytes]] = weakref.WeakKeyDictionary()


class Statement:
    """A statement with ``$n`` placeholders, run straight through libpq when it can be.

    On a connection in autocommit (no transaction of the caller's to join) it goes through
    libpq. Inside a transaction it goes through a psycopg ``RawCursor`` instead, so that
    psycopg opens the transaction Django asked for (a bare libpq call would run outside it,
    in autocommit), reading the same text.

    Errors are psycopg's (from the result's SQLSTATE) raised inside Django's error wrapper, as
    ``sagas.store.systemdb.cursor()``'s are: they come out as ``django.db`` errors, and a dead
    connection is dropped by the caller's ``note_failure``.
    """

    def __init__(self, name: str, sql: str) -> None:
        self.name = name.encode()
        self.sql = sql

    def first_row(self, params: list[Any]) -> tuple[Any, ...] | None:
        """The first row of the result (values as text, None for NULL), or None for no row.

        ``params`` are Python values: None, str, int, float, bool, datetime, or a list of
        strings for a ``text[]``; each is sent as PostgreSQL reads it in text."""
        db = connections[DEFAULT_DB_ALIAS]
        db.ensure_connection()
        conn = db.connection
        pgconn = conn.pgconn
        if db.in_atomic_block or not conn.autocommit or pgconn.transaction_status != _IDLE:
            with db.wrap_database_errors, psycopg.RawCursor(conn) as cur:
                for type_name in _AS_TEXT:  # values as the libpq path returns them: PostgreSQL's text
                    cur.adapters.register_loader(type_name, TextLoader)
                cur.execute(self.sql, params)
                return cur.fetchone()
        values = [_text(v) for v in params]
        with db.wrap_database_errors:
            result = self._exec(conn, values)
            if result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
                # Deallocated behind our back (DEALLOCATE ALL, DISCARD ALL, a pooler): prepare it
                # again rather than fail the step on our own bookkeeping.
                _PREPARED[conn].discard(self.name)
                result = self._exec(conn, values)
            _check(result, conn)
        if result.ntuples == 0:
            return None
        return tuple(
            None if (v := result.get_value(0, i)) is None else v.decode() for i in range(result.nfields)
        )

    def _exec(self, conn: psycopg.Connection, values: list[bytes | None]) -> psycopg.pq.abc.PGresult:
        if not settings.SAGAS_PREPARED_STATEMENTS:  # behind a transaction pooler: unnamed, parsed each time
            return conn.pgconn.exec_params(self.sql.encode(), values)
        prepared = _PREPARED.get(conn)
        if prepared is None:
            prepared = _PREPARED[conn] = set()
        if self.name not in prepared:
            _check(conn.pgconn.prepare(self.name, self.sql.encode()), conn)
            prepared.add(self.name)
        # None is SQL NULL, as for exec_params; psycopg's annotation of exec_prepared alone leaves it out.
        return conn.pgconn.exec_prepared(self.name, values)  # type: ignore[arg-type]


def _text(value: Any) -> bytes | None:
    """``value`` as PostgreSQL's text input reads it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, (list, tuple)):  # an array literal, each element quoted
        return ("{" + ",".join('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value)
                + "}").encode()
    return str(value).encode()


def _check(result: psycopg.pq.abc.PGresult, conn: psycopg.Connection) -> None:
    if result.status in _OK:
        return
    if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        # The server went away (the result has no SQLSTATE): psycopg's own cursor raises
        # OperationalError here, which is what marks a storage failure (core.storage).
        raise psycopg.OperationalError(result.get_error_message(conn.info.encoding).strip())
    raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)

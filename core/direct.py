"""Connections that need a PostgreSQL session of their own: ``LISTEN`` and session advisory
locks. Behind a transaction pooler (``DATABASE_POOLER=transaction``) they connect to
``DATABASE_DIRECT_URL``, the database itself: a pooler in transaction mode hands each
transaction to whichever server connection is free, so a ``LISTEN`` would hear nothing and a
session lock taken by one statement would be released by no one (the next statement, its
``pg_advisory_unlock`` included, runs on another server connection). Otherwise they use the
same settings as Django's connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection, connections

_TCP = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "isolation_level",
                "assume_role", "pool")


def session_conninfo() -> dict[str, Any]:
    """psycopg connection parameters for a connection that keeps its session."""
    direct = getattr(settings, "DATABASE_DIRECT", None)
    if direct:
        params: dict[str, Any] = {"dbname": direct["NAME"], **direct.get("OPTIONS", {})}
        for key, field in (("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT")):
            if direct.get(field):
                params[key] = direct[field]
        # The session settings Django's connections get (jit, parallel query, the server's TCP
        # keepalives) hold here too, and so do the client's TCP keepalives (config/tcp.py).
        default = settings.DATABASES["default"].get("OPTIONS", {})
        if default.get("options") and "options" not in params:
            params["options"] = default["options"]
        for key in _TCP:
            if key in default and key not in params:
                params[key] = default[key]
    else:
        params = dict(connections["default"].get_connection_params())
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    return params


def through_pooler() -> bool:
    return getattr(settings, "DATABASE_POOLER", "") == "transaction"


@contextmanager
def session_advisory_lock(lock_id: int) -> Iterator[bool]:
    """``pg_try_advisory_lock(lock_id)`` held for the block (True if taken; False: someone has
    it). Behind a transaction pooler, on a direct connection of its own, closed after; else on
    Django's connection, as before."""
    if not through_pooler():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [lock_id])
            taken = bool(cur.fetchone()[0])
            try:
                yield taken
            finally:
                if taken:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
        return
    import psycopg

    with psycopg.connect(**session_conninfo(), autocommit=True, connect_timeout=5) as conn:
        taken = bool(conn.execute("SELECT pg_try_advisory_lock(%s)", [lock_id]).fetchone()[0])  # type: ignore[index]
        try:
            yield taken
        finally:
            if taken:
                conn.execute("SELECT pg_advisory_unlock(%s)", [lock_id])

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection

from core.commands import NoPageCommand


class Command(NoPageCommand):
    help = "Create the configured PostgreSQL database if it does not exist (for first-time setup)."

    def handle(self, *args: Any, **options: Any) -> None:
        name = connection.settings_dict["NAME"]
        wanted = {"host", "port", "user", "password"}
        params = {k: v for k, v in connection.get_connection_params().items() if k in wanted}
        try:
            with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **params) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                    return
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        except psycopg.OperationalError as exc:
            raise SystemExit(
                f"cannot reach PostgreSQL at {params.get('host')}:{params.get('port') or 5432} "
                f"as {params.get('user')!r}: {exc}\nSet DATABASE_URL, or start PostgreSQL."
            ) from None
        self.stdout.write(f"created database {name!r}")

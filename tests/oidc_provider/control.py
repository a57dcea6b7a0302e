"""Start the test OIDC provider as a real process, and change its users the way an administrator
of a real one would (in its own database, behind the console's back)."""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from tests.procs import Proc, Procs, wait_until


@dataclass
class Provider:
    proc: Proc
    url: str
    db: Path

    def endpoints(self) -> dict[str, str]:
        """The console's OIDC_* settings for this provider (its discovery document lists the same)."""
        return {
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/o/authorize/",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/o/token/",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/o/userinfo/",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/o/.well-known/jwks.json",
        }

    def _execute(self, sql: str, params: tuple) -> int:
        with sqlite3.connect(self.db, timeout=10) as db:
            return db.execute(sql, params).rowcount

    def set_active(self, username: str, active: bool) -> None:
        assert self._execute("UPDATE auth_user SET is_active = ? WHERE username = ?", (active, username)) == 1

    def remove_from_group(self, username: str, group: str) -> None:
        assert self._execute(
            """DELETE FROM auth_user_groups WHERE user_id = (SELECT id FROM auth_user WHERE username = ?)
                  AND group_id = (SELECT id FROM auth_group WHERE name = ?)""", (username, group)) == 1


def start_provider(procs: Procs, folder: Path, redirect_uris: list[str], **env: str) -> Provider:
    """The provider on a free port of 127.0.0.1, seeded (tests/oidc_provider/people.py), its
    database and signing key in ``folder``."""
    db = folder / "provider.sqlite3"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SAGAS_", "OIDC_"))}
    environ.update(OIDC_PROVIDER_DB=str(db), OIDC_PROVIDER_KEY=str(folder / "provider-key.pem"), PYTHONUNBUFFERED="1",
                   **env)
    args = ["-m", "tests.oidc_provider.serve"]
    for uri in redirect_uris:
        args += ["--redirect-uri", uri]
    proc = procs.start("oidc-provider", args, environ)
    found = wait_until(lambda: re.search(r"listening on (http://\S+)", proc.log()) or not proc.alive(), 60,
                       what="the OIDC provider to listen")
    assert proc.alive(), proc.log()
    return Provider(proc, found.group(1), db)

"""Run the test OIDC provider: ``python -m tests.oidc_provider.serve --redirect-uri URI ...``.

Creates its SQLite database (OIDC_PROVIDER_DB) and its signing key (OIDC_PROVIDER_KEY) if
missing, seeds the users of ``people`` and the console's client (its redirect URIs: those
given), then serves HTTP on 127.0.0.1 on a free port, printing ``listening on http://...``.
One process does all of it, so the provider costs one Django start-up."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _key(path: Path) -> None:
    if path.exists():
        return
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _seed(redirect_uris: list[str]) -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    from tests.oidc_provider.people import CLIENT_ID, CLIENT_SECRET, PASSWORD, USERS

    for username, groups in USERS.items():
        user, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.com"})
        if created:
            user.set_password(PASSWORD)
            user.save()
            user.groups.set([Group.objects.get_or_create(name=name)[0] for name in groups])
    Application.objects.update_or_create(client_id=CLIENT_ID, defaults={
        "name": "Saga Console", "client_secret": CLIENT_SECRET, "client_type": Application.CLIENT_CONFIDENTIAL,
        "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE, "redirect_uris": " ".join(redirect_uris),
        "skip_authorization": True, "algorithm": Application.RS256_ALGORITHM,
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redirect-uri", action="append", default=[])
    args = parser.parse_args()
    _key(Path(os.environ["OIDC_PROVIDER_KEY"]))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0)
    _seed(args.redirect_uri)
    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler)
    server.set_app(get_wsgi_application())
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Settings of the test OIDC provider (``python -m tests.oidc_provider.serve``).

Environment: OIDC_PROVIDER_DB (its SQLite file), OIDC_PROVIDER_KEY (a PEM RSA private key file:
the ID tokens' RS256 signing key), OIDC_PROVIDER_TOKEN_SECONDS (how long an access token lasts;
short, as some real providers' are, to make the console refresh it)."""

from __future__ import annotations

import os
from pathlib import Path

SECRET_KEY = "oidc-provider-for-tests-only-not-a-secret-0123456789abcdef"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.oidc_provider.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [Path(__file__).resolve().parent / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("OIDC_PROVIDER_DB", ":memory:")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
# Its own cookie name: the console under test runs on the same host (127.0.0.1), where cookies
# are shared between ports; the two sessions must not overwrite each other.
SESSION_COOKIE_NAME = "provider_sessionid"
CSRF_COOKIE_NAME = "provider_csrftoken"
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a test provider: fast, not safe

_key = os.environ.get("OIDC_PROVIDER_KEY", "")
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": Path(_key).read_text() if _key else "",
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.claims.ClaimsValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "profile", "email": "email"},
    "PKCE_REQUIRED": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": int(os.environ.get("OIDC_PROVIDER_TOKEN_SECONDS", "36000")),
}

"""Strict parsing of configuration from the environment.

Every reader raises ``ImproperlyConfigured`` on a malformed value, so a typo in
a deployment fails at start-up instead of silently falling back to a default.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off)")


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_list(name: str, default: str = "") -> list[str]:
    raw = os.environ.get(name, default)
    return [part.strip() for part in raw.split(",") if part.strip()]


def parse_database_url(url: str) -> dict:
    """Turn ``postgres://user:pass@host:port/name?opt=v`` into a Django DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(f"DATABASE_URL scheme {parts.scheme!r} is not supported (use postgres://)")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL has no database name")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"DATABASE_URL has a malformed port: {url!r}") from None
    options: dict[str, str] = {}
    if parts.query:
        for pair in parts.query.split("&"):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ImproperlyConfigured(f"DATABASE_URL option {pair!r} is not key=value")
            options[unquote(key)] = unquote(value)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "OPTIONS": options,
    }


def validate_redis_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"REDIS_URL scheme {parts.scheme!r} is not supported (use redis://)")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL database {db!r} is not a number")
    return url

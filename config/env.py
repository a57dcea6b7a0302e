"""Strict parsing of configuration from the environment.

Every reader raises ``ImproperlyConfigured`` on a malformed value, so a typo in
a deployment fails at start-up instead of silently falling back to a default.
"""

from __future__ import annotations

import json
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


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_list(name: str, default: str = "") -> list[str]:
    raw = os.environ.get(name, default)
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_prices(name: str, default: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Model prices from JSON, ``{"model": [usd per 1M input tokens, usd per 1M output], "*": [...]}``;
    a malformed value stops the process at start-up rather than charging agents nothing."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        data = json.loads(raw)
        prices = {str(k): (float(v[0]), float(v[1])) for k, v in data.items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ImproperlyConfigured(f"{name} must be JSON like {{\"model\": [0.15, 0.6]}}: {exc}") from None
    if any(p < 0 or p != p for pair in prices.values() for p in pair):
        raise ImproperlyConfigured(f"{name}: prices must be numbers of at least 0")
    return prices


def env_json_map(name: str) -> dict[str, list[str]]:
    """A JSON object from the environment whose values are a string or a list of strings, as
    ``{"key": ["value", ...]}`` (empty or unset: ``{}``), e.g. the claim values that map to
    roles; anything else stops the process at start-up."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    example = f'{name} must be a JSON object of strings or lists of strings, like {{"ops-approvers": "approver"}}'
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{example}: {exc}") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured(example)
    found: dict[str, list[str]] = {}
    for key, value in data.items():
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise ImproperlyConfigured(f"{example}; {key!r} maps to {value!r}")
        found[key] = values
    return found

def env_origins(name: str) -> list[str]:
    """Comma-separated origins, each ``scheme://host[:port]`` (as ``CSRF_TRUSTED_ORIGINS`` needs)."""
    origins = env_list(name)
    for origin in origins:
        parts = urlsplit(origin)
        if parts.scheme not in {"http", "https"} or not parts.netloc or parts.path not in {"", "/"}:
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin (use scheme://host[:port], e.g. https://console.example.com)"
            )
    return origins


def env_proxy_header(name: str) -> tuple[str, str] | None:
    """``HEADER,value`` (e.g. ``HTTP_X_FORWARDED_PROTO,https``) as Django's ``SECURE_PROXY_SSL_HEADER``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = (part.strip() for part in raw.partition(","))
    if not sep or not value or "," in value or not header.startswith("HTTP_") or not header.replace("_", "").isalnum():
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not HEADER,value (the header as Django names it, e.g. HTTP_X_FORWARDED_PROTO,https)"
        )
    return header.upper(), value


def production_secret_key(name: str, *, dev_key: str) -> str:
    """The secret key a process with DEBUG off needs: set, not the development key, and long and
    varied enough that Django's deploy check (security.W009) accepts it."""
    value = os.environ.get(name, "")
    how = "set it to a random string, e.g. the output of: python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    if not value:
        raise ImproperlyConfigured(f"{name} must be set when DEBUG is off; {how} (or set DEBUG=1 for development)")
    if value == dev_key or value.startswith("django-insecure"):
        raise ImproperlyConfigured(f"{name} is the development key, which must not be used with DEBUG off; {how}")
    if len(value) < 50 or len(set(value)) < 5:
        raise ImproperlyConfigured(
            f"{name} is too weak ({len(value)} characters, {len(set(value))} distinct): use at least 50 characters "
            f"and 5 distinct ones; {how}"
        )
    return value


def parse_database_url(url: str, *, name: str = "DATABASE_URL") -> dict:
    """Turn ``postgres://user:pass@host:port/name?opt=v`` into a Django DATABASES entry.

    Several hosts, as libpq takes them (``postgres://u@db-a:5432,db-b:5432/name?target_session_attrs=read-write``,
    what ``pg_autoctl show uri`` prints): HOST and PORT become libpq's comma-separated lists, and
    each new connection tries the hosts in order and keeps the first that matches
    ``target_session_attrs``; after a failover, the next connection finds the new primary."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed [ of an IPv6 address
        raise ImproperlyConfigured(f"{name} has a malformed host ({exc}): {url!r}") from None
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(f"{name} scheme {parts.scheme!r} is not supported (use postgres://)")
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise ImproperlyConfigured(f"{name} has no database name")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts, ports = [], []
    for item in hostlist.split(",") if hostlist else []:
        host, port = _host_port(item, name=name, url=url)
        hosts.append(host)
        ports.append(port)
    if len(hosts) > 1 and "" in hosts:
        raise ImproperlyConfigured(f"{name} has an empty host in its host list: {url!r}")
    options: dict[str, str] = {}
    if parts.query:
        for pair in parts.query.split("&"):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ImproperlyConfigured(f"{name} option {pair!r} is not key=value")
            options[unquote(key)] = unquote(value)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": ",".join(hosts),
        # One port for every host, or one per host (libpq: an empty one is the default, 5432).
        "PORT": ",".join(ports) if any(ports) else "",
        "OPTIONS": options,
    }


def _host_port(item: str, *, name: str, url: str) -> tuple[str, str]:
    """``host``, ``host:port`` or ``[v6]:port`` of a URL's host list."""
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ImproperlyConfigured(f"{name} has a malformed host {item!r}: {url!r}")
        port = rest[1:]
    else:
        host, _, port = item.partition(":")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ImproperlyConfigured(f"{name} has a malformed port: {url!r}")
    return unquote(host), port


def validate_redis_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"REDIS_URL scheme {parts.scheme!r} is not supported (use redis://)")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL database {db!r} is not a number")
    return url


TRACE_EXPORTERS = ("otlp", "console", "none")


def env_trace_exporters(name: str = "OTEL_TRACES_EXPORTER") -> tuple[str, ...]:
    """OpenTelemetry's exporter list (comma-separated; unset: ``otlp``) as far as this product
    ships exporters: ``otlp`` (OTLP over HTTP/protobuf), ``console`` (stdout), ``none``. The OTLP
    protocol, if set, must be ``http/protobuf``: the gRPC exporter is not installed."""
    names = tuple(dict.fromkeys(env_list(name, "otlp")))
    unknown = [n for n in names if n not in TRACE_EXPORTERS]
    if unknown:
        raise ImproperlyConfigured(f"{name}={os.environ.get(name)!r}: unknown exporter {unknown[0]!r} "
                                   f"(use {', '.join(TRACE_EXPORTERS)})")
    for protocol_name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(protocol_name, "").strip()
        if protocol and protocol != "http/protobuf":
            raise ImproperlyConfigured(f"{protocol_name}={protocol!r}: only http/protobuf is supported "
                                       f"(send to the collector's OTLP/HTTP port, 4318)")
    return tuple(n for n in names if n != "none")


def env_url_template(name: str, *, placeholder: str) -> str:
    """An http(s) URL with ``placeholder`` in it (e.g. ``https://tempo.example/trace/{trace_id}``),
    or "" when unset. Printable ASCII without spaces, so a pasted line break fails at start."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in {"http", "https"} or not parts.netloc or placeholder not in raw \
            or any(not 0x21 <= ord(c) <= 0x7e for c in raw):
        raise ImproperlyConfigured(
            f"{name}={raw!r} must be an http:// or https:// URL of printable characters without spaces "
            f"containing {placeholder}, e.g. https://tempo.example/trace/{placeholder}"
        )
    return raw

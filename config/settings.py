"""Django settings. Everything that differs between machines comes from the environment.

Variables: DATABASE_URL, DATABASE_REPLICA_URL, REDIS_URL, SECRET_KEY, DEBUG, ALLOWED_HOSTS, SAGAS_MODULES,
SECURE_* / SESSION_COOKIE_SECURE / CSRF_* (README: "Deploying: settings from the environment"),
SAGAS_LEASE_TTL, SAGAS_SWEEP_INTERVAL, SAGAS_DISPATCH_LISTEN, SAGAS_DISPATCH_THREADS, SAGAS_DISPATCH_RQ_DELAY,
SAGAS_QUEUE,
SAGAS_CRASH_AT, SAGAS_WORKER_CONCURRENCY, SAGAS_MODEL_PRICES,
SAGAS_ARCHIVE_URL, SAGAS_ARCHIVE_WRITER, SAGAS_RETENTION_DAYS, SAGAS_EFFECT_KEY_DAYS, SAGAS_ARCHIVE_INTERVAL,
SAGAS_ARCHIVE_BATCH, SAGAS_ARCHIVE_PAUSE, CONSOLE_URL, NOTIFY_TIMEOUT, SAGAS_TRACING (with the OTEL_* variables),
SAGAS_TRACE_URL_TEMPLATE, SAGA_OIDC_* / SAGA_LOCAL_PASSWORDS / OIDC_* (single sign-on), DB_TCP_TIMEOUT.

The demo (example workflows and simulated providers) is not part of the product: it is
installed by ``config.settings_demo``, which ``make demo`` and the tests use.
"""

from __future__ import annotations

import re
from copy import deepcopy
from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_float,
    env_int,
    env_json_map,
    env_list,
    env_origins,
    env_prices,
    env_proxy_header,
    env_str,
    env_trace_exporters,
    env_url_template,
    parse_database_url,
    production_secret_key,
    validate_redis_url,
)
from config.tcp import tcp_timeout_options

BASE_DIR = Path(__file__).resolve().parent.parent

# Off unless set: a deployment that forgets it gets no debug pages. Development, the demo
# (make demo) and the tests set DEBUG=1; with DEBUG off the process refuses to start
# without a real SECRET_KEY and an explicit ALLOWED_HOSTS.
DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "dev-only-insecure-secret-key-change-me"
if DEBUG:
    SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
    # Never "*": the websocket's Origin check (config/asgi.py) compares against this list too.
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
else:
    SECRET_KEY = production_secret_key("SECRET_KEY", dev_key=_DEV_SECRET)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS must be set when DEBUG is off: the host names the console is served under, "
            "comma-separated (e.g. ALLOWED_HOSTS=console.example.com); it also limits which origins may "
            "open the live-update websocket"
        )

# HTTPS and the proxy in front (README: "Deploying: settings from the environment"). All off
# by default, for plain-HTTP development; manage.py check --deploy passes with them set.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
CSRF_TRUSTED_ORIGINS = env_origins("CSRF_TRUSTED_ORIGINS")
SECURE_PROXY_SSL_HEADER = env_proxy_header("SECURE_PROXY_SSL_HEADER")
# Error reports (the DEBUG page, error mails) hide URL/DSN settings and mask any password in a
# scheme://user:password@host string (Django's filter shows DATABASE_URL and REDIS_URL in full).
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.debug.CredentialsFilter"

# daphne serves config.asgi:application as its own command (``python -m daphne``, as the demo
# does); it is not an installed app. As one it only replaced ``runserver`` and, by importing
# Twisted at start-up, made every process (workers, sweepers, commands) 0.8 s slower to start.
# django-ninja is not one either, for the same reason: as an app its package (the router,
# pydantic) was imported by every process at start-up: django.setup() took about 2.8 CPU-s
# with it and 2.3 without. Its Swagger page's templates and static files are on the paths below
# (NINJA_ASSETS), and api.api renders that page from them.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "axes",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_rq",
    "django_htmx",
    "csp",
    "ledger",
    "sagas",
    "operators",
    "api",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # /api/v1/: problem JSON for unknown paths and methods, JSON bodies only (api/edges.py).
    "api.edges.ApiEdgesMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Single sign-on: ends the session of a user the OpenID Connect provider no longer accepts
    # (a no-op for password sessions and with SAGA_OIDC_ENABLED off; console/oidc.py).
    "console.oidc.SsoSessionCheck",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: it turns a login refused for a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"


def _package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it (find_spec runs none of its code)."""
    spec = find_spec(name)
    if spec is None or spec.origin is None:
        raise ImproperlyConfigured(f"the package {name!r} is not installed (pip install -e . installs it)")
    return Path(spec.origin).parent


NINJA_ASSETS = _package_dir("ninja")

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_ASSETS / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_console")
_db = parse_database_url(DATABASE_URL)
# pytest-django creates this database; worker processes started by tests are
# pointed at it explicitly, so its name must be known in advance.
_db["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", f"test_{_db['NAME']}")}
# Workers keep their connection (checked before reuse). The web process (config/asgi.py) takes
# connections from a pool instead: under ASGI each request's sync code runs in a thread of its
# own, where a kept connection would never be reused nor closed (DB_POOL_SIZE=0: no pool, a new
# connection per request).
# Every query the product runs is short, and two planner features meant for long queries only
# slow them down, so both are off for our sessions:
# - PostgreSQL's JIT compiles any query whose estimated cost passes jit_above_cost: the console's
#   counts over a partial index were estimated costly and spent 7 of their 11 ms compiling at
#   10M runs (DB_JIT=on to keep it);
# - a parallel plan starts worker processes for one query: the run list's sorted search of 14,000
#   matches took 22 to 26 ms with two workers, 12.7 ms without, at 10M runs, and the workers
#   take the cores the engine's workers need (DB_PARALLEL=on to keep it).
_session_settings = [] if env_bool("DB_JIT", False) else ["-c jit=off"]
if not env_bool("DB_PARALLEL", False):
    _session_settings.append("-c max_parallel_workers_per_gather=0")
# A host cut off from the network leaves its connections open at both ends (the server's for 2 h,
# with their locks): DB_TCP_TIMEOUT seconds without a TCP answer drops them (config/tcp.py; 0: the
# OS defaults). The URL's own connection parameters win.
DB_TCP_TIMEOUT = env_float("DB_TCP_TIMEOUT", 30.0)
_tcp_client, _tcp_server = tcp_timeout_options(DB_TCP_TIMEOUT)
_db["OPTIONS"] = {**_tcp_client, **_db.get("OPTIONS", {})}
_session_settings += _tcp_server
if _session_settings:
    _options = _db.setdefault("OPTIONS", {})
    _options["options"] = " ".join([_options.get("options", ""), *_session_settings]).strip()
_db["CONN_MAX_AGE"] = env_float("DB_CONN_MAX_AGE", 300.0)
_db["CONN_HEALTH_CHECKS"] = True
DB_POOL_SIZE = env_int("DB_POOL_SIZE", 0)
if DB_POOL_SIZE:
    _db["CONN_MAX_AGE"] = 0  # a pooled connection goes back to the pool at the end of each request
    # CONN_HEALTH_CHECKS stays on: Django then has the pool try a connection before handing it out,
    # so one the server dropped (a restart) is replaced instead of failing the request that drew it.
    _db.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": DB_POOL_SIZE, "timeout": 10}
DATABASES = {"default": _db}
# A PostgreSQL standby of that database for the console's page reads (lists, history, audit,
# exports); actions, the engine, workers, the sweeper and the API stay on the primary
# (core/replica.py, docs/operations/standby.md). Unset: no alias, no router.
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL", "").strip()
if DATABASE_REPLICA_URL:
    _replica = parse_database_url(DATABASE_REPLICA_URL, name="DATABASE_REPLICA_URL")
    _replica_options = {**deepcopy(_db.get("OPTIONS", {})), **_replica["OPTIONS"]}
    # A standby that is gone is given up on quickly (pages then read the primary).
    _replica_options.setdefault("connect_timeout", "2")
    if "pool" in _replica_options:
        _replica_options["pool"]["timeout"] = min(_replica_options["pool"]["timeout"], 3)
    DATABASES["replica"] = {
        **_replica, "OPTIONS": _replica_options, "CONN_MAX_AGE": _db["CONN_MAX_AGE"],
        "CONN_HEALTH_CHECKS": True, "TEST": {"MIRROR": "default"},
    }
    DATABASE_ROUTERS = ["core.replica.ReplicaRouter"]
    # A browser that has just acted reads the primary for a few seconds (its own action shows).
    MIDDLEWARE.append("core.replica.AfterWriteMiddleware")
# Behind a connection pooler (PgBouncer): DATABASE_POOLER=transaction when it pools by
# transaction. Then the engine prepares no statement (PgBouncer 1.18 cannot carry them from one
# transaction to the next), and what needs a session of its own (the workers' and the API's
# LISTEN connections, the sweeper's and the archiver's session advisory locks) connects to
# DATABASE_DIRECT_URL, the database itself (docs/operations/deploy.md, "Behind PgBouncer").
# session (or unset): everything works through the pooler unchanged.
DATABASE_POOLER = env_str("DATABASE_POOLER", "").strip().lower()
if DATABASE_POOLER not in ("", "session", "transaction"):
    raise ImproperlyConfigured(f"DATABASE_POOLER must be session or transaction, not {DATABASE_POOLER!r}")
DATABASE_DIRECT_URL = env_str("DATABASE_DIRECT_URL", "").strip()
if DATABASE_POOLER == "transaction" and not DATABASE_DIRECT_URL:
    raise ImproperlyConfigured("DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL: the LISTEN connections and the "
                               "session advisory locks need a session of their own, which a transaction pooler "
                               "does not keep")
DATABASE_DIRECT = (parse_database_url(DATABASE_DIRECT_URL, name="DATABASE_DIRECT_URL")
                   if DATABASE_DIRECT_URL else None)
SAGAS_PREPARED_STATEMENTS = DATABASE_POOLER != "transaction"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = validate_redis_url(env_str("REDIS_URL", "redis://127.0.0.1:6379/0"))

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": "sagas-console:"},
    }
}

# Content-Security-Policy (django-csp): scripts and styles only from our own static files, no
# inline script, no inline style, no eval; htmx is configured to need none (base.html). 'self'
# in connect-src also covers the live websocket (ws:/wss: on the same host and port, CSP 3).
# The Django admin works under it; the django-rq dashboard's one inline script (a jQuery call
# that Django's own actions.js has replaced) is blocked, to no loss.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# --- single sign-on (OpenID Connect through mozilla-django-oidc: console/oidc.py, console/services/sso.py;
# docs/operations/single-sign-on.md). Off unless SAGA_OIDC_ENABLED. The provider's endpoints are
# given one by one (its /.well-known/openid-configuration lists them): nothing is fetched at start-up.
SAGA_OIDC_ENABLED = env_bool("SAGA_OIDC_ENABLED", False)
# The login page's button: "Sign in with <SAGA_OIDC_PROVIDER_NAME>".
SAGA_OIDC_PROVIDER_NAME = env_str("SAGA_OIDC_PROVIDER_NAME", "single sign-on")
# Off: the login form is gone and no password signs anyone in, except superusers' at
# /login/break-glass/ (for when the provider is down); needs SAGA_OIDC_ENABLED.
SAGA_LOCAL_PASSWORDS = env_bool("SAGA_LOCAL_PASSWORDS", True)
# The claim that names the console user (made on the first sign-in; the user is then found by
# the provider's sub claim, whatever this one later says).
SAGA_OIDC_USERNAME_CLAIM = env_str("SAGA_OIDC_USERNAME_CLAIM", "preferred_username")
# Roles from a claim (a string or a list of strings): each value named in the map gives its
# role(s), JSON like {"ops-approvers": "approver", "ops": ["operator", "viewer"]}. The user's
# roles are set to exactly these at every sign-in.
SAGA_OIDC_ROLE_CLAIM = env_str("SAGA_OIDC_ROLE_CLAIM", "groups")
SAGA_OIDC_ROLE_MAP = env_json_map("SAGA_OIDC_ROLE_MAP")
# The tenant limit from a claim (unset: sign-ins leave tenant limits alone). Its values are the
# tenants, or with SAGA_OIDC_TENANT_MAP only the values named there, mapped ("*": every tenant);
# none: no tenant.
SAGA_OIDC_TENANT_CLAIM = env_str("SAGA_OIDC_TENANT_CLAIM", "")
SAGA_OIDC_TENANT_MAP = env_json_map("SAGA_OIDC_TENANT_MAP")
# Seconds between two checks that the provider still accepts a signed-in user's token (its
# userinfo endpoint, after a refresh if the token expired); a refusal ends the console session
# at that request. 0: at every request.
SAGA_OIDC_RECHECK_SECONDS = env_float("SAGA_OIDC_RECHECK_SECONDS", 60.0, minimum=0.0)
# mozilla-django-oidc's own settings, under its names.
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_OP_JWKS_ENDPOINT", "")
OIDC_RP_SIGN_ALGO = env_str("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid email profile")
OIDC_USE_PKCE = env_bool("OIDC_USE_PKCE", True)
OIDC_TIMEOUT = env_float("OIDC_TIMEOUT", 5.0, minimum=0.1)
OIDC_AUTHENTICATION_CALLBACK_URL = "console:sso_callback"
if SAGA_OIDC_ENABLED:
    _oidc_needed = ["OIDC_RP_CLIENT_ID", "OIDC_RP_CLIENT_SECRET", "OIDC_OP_AUTHORIZATION_ENDPOINT",
                    "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT"]
    if OIDC_RP_SIGN_ALGO[:2] in ("RS", "ES"):  # signed with the provider's key: its JWKS
        _oidc_needed.append("OIDC_OP_JWKS_ENDPOINT")
    _oidc_missing = [name for name in _oidc_needed if not globals()[name]]
    if _oidc_missing:
        raise ImproperlyConfigured(f"SAGA_OIDC_ENABLED is on but {', '.join(_oidc_missing)} "
                                   f"{'is' if len(_oidc_missing) == 1 else 'are'} not set (see the provider's "
                                   f"/.well-known/openid-configuration)")
elif not SAGA_LOCAL_PASSWORDS:
    raise ImproperlyConfigured("SAGA_LOCAL_PASSWORDS is off but SAGA_OIDC_ENABLED is not on: nobody but superusers "
                               "could sign in; turn single sign-on on, or passwords back on")

# django-axes first: it refuses a locked-out username+address before any password is checked.
# With SAGA_LOCAL_PASSWORDS off, passwords sign in superusers only (console.oidc.BreakGlassBackend).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend" if SAGA_LOCAL_PASSWORDS else "console.oidc.BreakGlassBackend",
    *(["console.oidc.SsoBackend"] if SAGA_OIDC_ENABLED else []),
]
# Login throttling: after AXES_FAILURE_LIMIT failed logins for one username from one address,
# that pair is locked out for AXES_COOLOFF_MINUTES (restarted by each attempt while locked);
# other addresses and other usernames are not. A successful login clears the count. Each
# lockout is in the audit log (console/auth_audit.py). Behind a proxy, run daphne with
# --proxy-headers so the address is the client's, not the proxy's.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("AXES_COOLOFF_MINUTES", 15.0, minimum=1.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "console.auth_audit.lockout_response"
AXES_WHITELIST_CALLABLE = "console.oidc.axes_exempt"  # single sign-on's callbacks are not password attempts

# Django's four validators; forms that set a password and manage.py createuser apply them.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:overview"
LOGOUT_REDIRECT_URL = "console:login"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads no cookie: the token is in hx-headers on <body>

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_ASSETS / "static"]
# daphne serves no static files: WhiteNoise does, from STATIC_ROOT after collectstatic,
# and straight from the app and project static folders without it (finders).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "sagas": {"handlers": ["console"], "level": env_str("SAGAS_LOG_LEVEL", "INFO"), "propagate": False},
        "rq.worker": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}

# --- engine -----------------------------------------------------------------
# Extra modules holding @workflow / @connector definitions (comma-separated).
SAGAS_MODULES = env_list("SAGAS_MODULES")
SAGAS_QUEUE = env_str("SAGAS_QUEUE", "sagas")
# django-rq holds the engine's Redis connection (sagas.runtime.queue) and serves the queue dashboard
# (/django-rq/, staff only). The queue listed is the compensation queue, which every worker
# reads, so the dashboard shows every worker; the per-version queues (<SAGAS_QUEUE>:<hash16>)
# are named at run time and made on this entry's connection. 5 s socket timeouts: a Redis
# that stops answering is an outage to ride out, not a worker hung on a dead socket.
_RQ_URL = REDIS_URL + ("&" if "?" in REDIS_URL else "?") + "socket_connect_timeout=5&socket_timeout=5"
RQ_QUEUES: dict[str, dict[str, Any]] = {
    f"{SAGAS_QUEUE}:compensation": {"URL": _RQ_URL, "DEFAULT_TIMEOUT": -1},
}
# A worker's claim on a run lasts this long unless its heartbeat renews it.
SAGAS_LEASE_TTL = env_float("SAGAS_LEASE_TTL", 15.0, minimum=1.0)
# How often the sweeper (standalone or inside workers) looks for lost work.
SAGAS_SWEEP_INTERVAL = env_float("SAGAS_SWEEP_INTERVAL", 2.0, minimum=0.1)
# A schedule's tick found more than this many seconds past its due time was missed (no sweeper
# ran): its schedule's catch-up mode decides whether it still fires (sagas/schedules).
SAGAS_SCHEDULE_GRACE = env_float("SAGAS_SCHEDULE_GRACE", 60.0, minimum=1.0)
# Workers LISTEN for runs made runnable and take them at once when a thread is free
# (sagas/runtime/dispatch.py); off: only RQ wakes them (one more connection per worker process on).
SAGAS_DISPATCH_LISTEN = env_bool("SAGAS_DISPATCH_LISTEN", True)
# Threads per worker process that take runs straight from those announcements, each with a database
# connection of its own (at most the process's concurrency; the RQ threads take the rest).
SAGAS_DISPATCH_THREADS = env_int("SAGAS_DISPATCH_THREADS", 1, minimum=1)
# With SAGAS_DISPATCH_LISTEN on, start() sends a new run's RQ wake-up this many seconds after its
# commit, from a thread of its own: an idle worker has taken the run from the announcement by then,
# and neither start()'s caller nor that worker waits for Redis. 0: at once, in start().
SAGAS_DISPATCH_RQ_DELAY = env_float("SAGAS_DISPATCH_RQ_DELAY", 0.05, minimum=0.0)
# Crash points for tests, e.g. "after_step:charge" (see sagas/runtime/crashpoints.py).
SAGAS_CRASH_AT = env_list("SAGAS_CRASH_AT")
# Runs one worker process advances at once, one thread each (sagas_worker --concurrency overrides it).
SAGAS_WORKER_CONCURRENCY = env_int("SAGAS_WORKER_CONCURRENCY", 1, minimum=1)

# Retention (sagas/retention/archiving.py, README "Retention and archives"): terminal runs (completed,
# compensated, cancelled, failed) finished more than SAGAS_RETENTION_DAYS ago (a workflow's own
# ``retention=`` first) are written to SAGAS_ARCHIVE_URL, one gzip JSON Lines file per UTC day of
# their finish, then deleted. Other schemes than file:// need SAGAS_ARCHIVE_WRITER, the dotted path
# of a class taking the URL (sagas.retention.store.ArchiveStore). Settled effect keys stay SAGAS_EFFECT_KEY_DAYS
# after archiving in a key index so a repeat is still deduplicated. Workers (not --no-sweep) archive
# every SAGAS_ARCHIVE_INTERVAL seconds (0: never), SAGAS_ARCHIVE_BATCH runs per transaction,
# SAGAS_ARCHIVE_PAUSE seconds apart.
SAGAS_ARCHIVE_URL = env_str("SAGAS_ARCHIVE_URL", f"file://{BASE_DIR / '.run' / 'archive'}")
SAGAS_ARCHIVE_WRITER = env_str("SAGAS_ARCHIVE_WRITER", "")
SAGAS_RETENTION_DAYS = env_float("SAGAS_RETENTION_DAYS", 30.0, minimum=0.0)
SAGAS_EFFECT_KEY_DAYS = env_float("SAGAS_EFFECT_KEY_DAYS", 90.0, minimum=0.0)
SAGAS_ARCHIVE_INTERVAL = env_float("SAGAS_ARCHIVE_INTERVAL", 3600.0, minimum=0.0)
SAGAS_ARCHIVE_BATCH = env_int("SAGAS_ARCHIVE_BATCH", 500, minimum=1)
# 0.5 s: bench/retention.py measured a busy worker 41 % slower beside a pass pausing 0.05 s (1M
# runs) and 16 % slower with 0.5 s (100,000 runs), at 620 runs archived per second: a day of one
# worker's runs in well under an hour. Raise it to leave the workers more; lower it to catch up.
SAGAS_ARCHIVE_PAUSE = env_float("SAGAS_ARCHIVE_PAUSE", 0.5, minimum=0.0)

# Model prices for durable agents (sagas/agents.py): usd per million input and output tokens, by
# the model name a response reports; "*" prices any other model. A model without a price costs 0
# (the conversation view says "unpriced"), so set this before relying on max_cost. JSON in the
# environment, e.g. SAGAS_MODEL_PRICES='{"gpt-4o-mini": [0.15, 0.6], "*": [3, 15]}'.
SAGAS_MODEL_PRICES = env_prices("SAGAS_MODEL_PRICES", {})
# Attempts at one model request (same key; 0.5 s, 1 s, 2 s... apart) when the model side fails
# (rate limit, overload, 5xx, connection); then the run parks as model_unavailable, for "retry".
SAGAS_AGENT_MODEL_ATTEMPTS = env_int("SAGAS_AGENT_MODEL_ATTEMPTS", 4, minimum=1)

# --- notifications (console/notifications/) ---
# The console's address as people open it: the base of the links in notifications.
CONSOLE_URL = env_str("CONSOLE_URL", "http://127.0.0.1:8000")
# Seconds a webhook endpoint has to answer before the delivery is UNKNOWN.
NOTIFY_TIMEOUT = env_float("NOTIFY_TIMEOUT", 10.0, minimum=0.1)

# --- redaction ---
# Key names hidden on every page, export and admin view on top of core/redaction.py's list:
# comma-separated, each matched by whole name segments (e.g. "dob,mothers maiden name").
REDACTION_EXTRA_KEYS = env_list("REDACTION_EXTRA_KEYS")

# --- metrics ---
# The bearer token Prometheus sends to /metrics (``Authorization: Bearer <token>``, README
# "Metrics"). Unset or empty: /metrics answers 404. 16 to 512 printable ASCII characters
# without spaces, so a truncated or pasted-with-a-space token fails at start, not at 3 a.m.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
if METRICS_TOKEN and not re.fullmatch(r"[\x21-\x7e]{16,512}", METRICS_TOKEN):
    raise ImproperlyConfigured(
        "METRICS_TOKEN must be 16 to 512 printable ASCII characters without spaces "
        "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
    )

# --- tracing (sagas/tracing.py, docs/operations/tracing.md) ---
# OpenTelemetry spans for every run's attempts, steps, effects and compensations, one trace per
# run. Off by default; on, the exporter is configured by the standard OTEL_* variables
# (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_BSP_*...).
# OTEL_SDK_DISABLED=true turns it off too, as it does every OpenTelemetry SDK.
SAGAS_TRACING = env_bool("SAGAS_TRACING", False) and not env_bool("OTEL_SDK_DISABLED", False)
SAGAS_TRACING_EXPORTERS = env_trace_exporters() if SAGAS_TRACING else ()
# The run page links to the run's trace: {trace_id} (32 hex digits) and {run_id} are filled in.
# Unset: no link. E.g. https://tempo.example/trace/{trace_id} or http://jaeger:16686/trace/{trace_id}.
SAGAS_TRACE_URL_TEMPLATE = env_url_template("SAGAS_TRACE_URL_TEMPLATE", placeholder="{trace_id}")

# --- dual control (operators/services/dual.py, docs/operations/dual-control.md) ---------------
# Which dangerous actions need a second person, for which tenants: a JSON object of rule ->
# "*" (every tenant) or a list of tenants. Rules: run.compensate (also cancelling with
# compensation), effect.resolve_unsafe (resolving as not executed or failed), run.fork, run.move,
# run.redrive, run.pause (the repair actions) and bulk (a bulk batch of at least
# SAGA_DUAL_CONTROL_BULK_ITEMS items, or of an action a rule covers). Unset: none.
SAGA_DUAL_CONTROL = env_json_map("SAGA_DUAL_CONTROL")
SAGA_DUAL_CONTROL_BULK_ITEMS = env_int("SAGA_DUAL_CONTROL_BULK_ITEMS", 100, minimum=1)
SAGA_DUAL_CONTROL_MINUTES = env_int("SAGA_DUAL_CONTROL_MINUTES", 60, minimum=1)  # a request's deadline

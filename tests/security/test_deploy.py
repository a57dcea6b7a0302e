"""A deployment configured only from the environment: ``manage.py check --deploy`` passes with the
documented variables set (README, "Deploying: settings from the environment"), and a careless one
(DEBUG unset and no key, a weak key, no ALLOWED_HOSTS, a typo) is refused at start-up, by name."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.procs import run_python

STRONG_KEY = "kP3v-9QxZr_t7Lm2Wn8Bc4Yd6Hf1Js5Ge0Ua8Ti3Ro7Ek2Vw9Xq4Nb6Mz1Ch5Dl0Sy"
PRODUCTION = {
    "SECRET_KEY": STRONG_KEY,
    "ALLOWED_HOSTS": "console.example.com",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_SSL_REDIRECT": "1",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "CSRF_TRUSTED_ORIGINS": "https://console.example.com",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
}
SECURITY_VARIABLES = {name for name in PRODUCTION if name not in {"SECRET_KEY", "ALLOWED_HOSTS"}}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``manage.py`` in a fresh process with production settings: DEBUG unset, nothing of the
    tests' environment that these settings read, plus ``env``. (The browser tests set
    DJANGO_ALLOW_ASYNC_UNSAFE for Playwright; a deployment never has it, and check --deploy says so.)"""
    base = {k: v for k, v in os.environ.items()
            if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE", *PRODUCTION}
            and not k.startswith("SECURE_")}
    base.update(DJANGO_SETTINGS_MODULE="config.settings", **env)
    return run_python(["manage.py", *args], env=base, timeout=120)


def test_it_passes_the_deploy_check_with_the_documented_variables_set():
    done = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def test_it_names_each_https_warning_while_the_variables_are_unset():
    done = manage("check", "--deploy", "--fail-level", "WARNING",
                  **{k: v for k, v in PRODUCTION.items() if k not in SECURITY_VARIABLES})
    assert done.returncode == 1, done.stdout + done.stderr
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SECRET_KEY must be set when DEBUG is off"),
        ({"SECRET_KEY": "short-but-not-empty"}, "SECRET_KEY is too weak (19 characters"),
        ({"SECRET_KEY": "dev-only-insecure-secret-key-change-me"}, "SECRET_KEY is the development key"),
        ({"SECRET_KEY": STRONG_KEY}, "ALLOWED_HOSTS must be set when DEBUG is off"),
        ({"SECRET_KEY": STRONG_KEY, "ALLOWED_HOSTS": "a.example", "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"},
         "SECURE_PROXY_SSL_HEADER='X-Forwarded-Proto: https' is not HEADER,value"),
        ({"SECRET_KEY": STRONG_KEY, "ALLOWED_HOSTS": "a.example", "CSRF_TRUSTED_ORIGINS": "console.example.com"},
         "CSRF_TRUSTED_ORIGINS: 'console.example.com' is not an origin"),
        ({"SECRET_KEY": STRONG_KEY, "ALLOWED_HOSTS": "a.example", "SECURE_HSTS_SECONDS": "1 year"},
         "SECURE_HSTS_SECONDS='1 year' is not a whole number"),
        ({"DEBUG": "of"}, "DEBUG='of' is not a boolean"),
        ({"DEBUG": "1", "AXES_FAILURE_LIMIT": "five"}, "AXES_FAILURE_LIMIT='five' is not a whole number"),
    ],
    ids=["no-key", "short-key", "dev-key", "no-allowed-hosts", "proxy-header-typo", "origin-without-scheme",
         "hsts-not-a-number", "debug-typo", "lockout-limit-typo"],
)
def test_it_refuses_to_start_a_careless_deployment_and_says_why(env, message):
    done = manage("check", **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and message in done.stderr, done.stderr


def test_it_starts_for_development_only_when_debug_is_set():
    done = manage("check", DEBUG="1")
    assert done.returncode == 0, done.stdout + done.stderr

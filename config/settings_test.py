"""Settings for the test suite: its own Redis database, never anyone else's.

pytest-django imports this before any conftest runs, which is why the Redis URL
is decided here and not in a fixture. ``TEST_REDIS_URL`` overrides the default
(database 15 on the local server).
"""

from __future__ import annotations

import fcntl
import json
import os

from django.core.exceptions import ImproperlyConfigured

# Two test sessions at once in one checkout (a developer's and an editor's, or several
# helpers) must not share a test database or a Redis database: each test flushes its
# Redis db, and pytest-django drops the database at the end. Each session takes the
# first free slot (an flock held for the life of the process) and gets its own pair.
# Slot 0 is what a lone session gets: test_<db> and Redis db 15, as before.
_REDIS_DBS = (15, 9, 8, 7, 6, 5, 4, 3)  # 0 is for development; 1, 2 and 10-14 for the benchmarks
# Under pytest-xdist every worker (gw0, gw1, ...) is a session of its own here, and
# pytest-django also suffixes its test database with _gw0, _gw1, ... The pytest process that
# starts the workers imports this module first, takes a slot and then runs no test: it hands
# that slot to gw0 through this variable, so `make test` on two workers takes two slots, not
# three. A worker starts from its parent's environment, which this module changed; the
# variable also carries back the REDIS_URL and TEST_DATABASE_NAME the parent started with.
_HANDED_DOWN = "SAGA_CONSOLE_TEST_SESSION"
_OWN_ENV = ("REDIS_URL", "TEST_DATABASE_NAME")


def _take_slot() -> int:
    for slot in range(len(_REDIS_DBS)):
        handle = open(f"/tmp/saga-console-test-slot-{slot}.lock", "a")  # noqa: SIM115  (held: the lock lasts as long as it)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held.append(handle)
        return slot
    raise ImproperlyConfigured(f"more than {len(_REDIS_DBS)} test sessions are running at once")


def _this_process_slot() -> int:
    handed = json.loads(os.environ.pop(_HANDED_DOWN, "null"))
    # Only a direct child of the process that set it: a worker's own children (daphne, a
    # benchmark) never see the variable, which a worker removes and does not set again.
    if handed is not None and handed["pid"] == os.getppid():
        for name, value in handed["env"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    else:
        handed = None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "TEST_REDIS_URL" in os.environ:
        if workers > 1:
            raise ImproperlyConfigured(
                f"TEST_REDIS_URL names one Redis database for {workers} pytest-xdist workers, which flush it "
                "under each other's tests: run with -n 0, or leave TEST_REDIS_URL unset"
            )
        return 0
    if handed is not None and os.environ.get("PYTEST_XDIST_WORKER") == "gw0":
        return handed["slot"]  # the parent holds its flock until every worker is done
    return _take_slot()


# The tests run as development does (DEBUG=1, the development key): config.settings refuses to
# start otherwise, and the processes the tests start (daphne, workers, the demo) inherit it.
os.environ.setdefault("DEBUG", "1")

_held: list = []
_slot = _this_process_slot()
if "PYTEST_XDIST_WORKER" not in os.environ:
    _before = {name: os.environ.get(name) for name in _OWN_ENV}
    os.environ[_HANDED_DOWN] = json.dumps({"pid": os.getpid(), "slot": _slot, "env": _before})
_dev_redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
_test_redis = os.environ.get("TEST_REDIS_URL", f"redis://127.0.0.1:6379/{_REDIS_DBS[_slot]}")
if _slot and "TEST_DATABASE_NAME" not in os.environ:
    from config.env import parse_database_url

    _name = parse_database_url(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_console"))["NAME"]
    os.environ["TEST_DATABASE_NAME"] = f"test_{_name}_s{_slot}"
if _test_redis.rstrip("/") == _dev_redis.rstrip("/"):
    raise ImproperlyConfigured("TEST_REDIS_URL must differ from REDIS_URL: the tests flush their Redis database")
os.environ["REDIS_URL"] = _test_redis

from django.conf import global_settings  # noqa: E402

from config.settings_demo import *  # noqa: E402,F403

# The suite's own app: its flush command empties the tables between transactional tests with
# DELETEs instead of Django's TRUNCATE (tests/harness/management/commands/flush.py).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.harness"]  # noqa: F405

# Passwords: the product's algorithm with few iterations (tests/harness/hashers.py), so that
# creating a user costs the tests no half-second; daphne and the workers verify these hashes.
PASSWORD_HASHERS = ["tests.harness.hashers.QuickPBKDF2PasswordHasher", *global_settings.PASSWORD_HASHERS]

SAGAS_LEASE_TTL = 3.0
SAGAS_SWEEP_INTERVAL = 0.5
# start() sends a new run's RQ wake-up at once, so a test sees the queue as start() left it; the
# product's default (a moment after the commit, when workers listen) is tested where it matters
# (tests/sagas/test_hot_path.py, test_dispatch_listen.py). Worker processes inherit the variable.
SAGAS_DISPATCH_RQ_DELAY = env_float("SAGAS_DISPATCH_RQ_DELAY", 0.0)  # noqa: F405

# The journal and the audit log refuse TRUNCATE (core/append_only.py), and pytest-django
# empties the tables with TRUNCATE after every transactional test. The test harness, and
# nothing else, turns the refusal off for its own connections; production's protection
# is the runtime role, which may not TRUNCATE at all (README, "Least-privilege database role").
from core.append_only import TRUNCATE_ESCAPE_GUC  # noqa: E402

_db_options = DATABASES["default"]["OPTIONS"]  # noqa: F405
_db_options["options"] = f"{_db_options.get('options', '')} -c {TRUNCATE_ESCAPE_GUC}=on".strip()


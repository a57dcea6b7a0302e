"""Settings for the test suite: its own Redis database, never anyone else's.

pytest-django imports this before any conftest runs, which is why the Redis URL
is decided here and not in a fixture. ``TEST_REDIS_URL`` overrides the default
(database 15 on the local server).
"""

from __future__ import annotations

import fcntl
import os

from django.core.exceptions import ImproperlyConfigured

# Two test sessions at once in one checkout (a developer's and an editor's, or several
# helpers) must not share a test database or a Redis database: each test flushes its
# Redis db, and pytest-django drops the database at the end. Each session takes the
# first free slot (an flock held for the life of the process) and gets its own pair.
# Slot 0 is what a lone session gets: test_<db> and Redis db 15, as before.
_REDIS_DBS = (15, 9, 8, 7, 6, 5, 4, 3)  # 0 is for development, 10-14 for the benchmarks


def _take_slot() -> int:
    for slot in range(len(_REDIS_DBS)):
        handle = open(f"/tmp/saga-console-test-slot-{slot}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held.append(handle)
        return slot
    raise ImproperlyConfigured(f"more than {len(_REDIS_DBS)} test sessions are running at once")


# The tests run as development does (DEBUG=1, the development key): config.settings refuses to
# start otherwise, and the processes the tests start (daphne, workers, the demo) inherit it.
os.environ.setdefault("DEBUG", "1")

_held: list = []
_slot = 0 if "TEST_REDIS_URL" in os.environ else _take_slot()
_dev_redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
_test_redis = os.environ.get("TEST_REDIS_URL", f"redis://127.0.0.1:6379/{_REDIS_DBS[_slot]}")
if _slot and "TEST_DATABASE_NAME" not in os.environ:
    from config.env import parse_database_url

    _name = parse_database_url(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_console"))["NAME"]
    os.environ["TEST_DATABASE_NAME"] = f"test_{_name}_s{_slot}"
if _test_redis.rstrip("/") == _dev_redis.rstrip("/"):
    raise ImproperlyConfigured("TEST_REDIS_URL must differ from REDIS_URL: the tests flush their Redis database")
os.environ["REDIS_URL"] = _test_redis

from config.settings import *  # noqa: E402,F403

SAGAS_LEASE_TTL = 3.0
SAGAS_SWEEP_INTERVAL = 0.5

# The journal and the audit log refuse TRUNCATE (config/append_only.py), and pytest-django
# empties the tables with TRUNCATE after every transactional test. The test harness, and
# nothing else, turns the refusal off for its own connections; production's protection
# is the runtime role, which may not TRUNCATE at all (README, "Least-privilege database role").
from config.append_only import TRUNCATE_ESCAPE_GUC  # noqa: E402

_db_options = DATABASES["default"]["OPTIONS"]  # noqa: F405
_db_options["options"] = f"{_db_options.get('options', '')} -c {TRUNCATE_ESCAPE_GUC}=on".strip()

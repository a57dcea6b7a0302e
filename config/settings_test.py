"""Settings for the test suite: its own Redis database, never anyone else's.

pytest-django imports this before any conftest runs, which is why the Redis URL
is decided here and not in a fixture. ``TEST_REDIS_URL`` overrides the default
(database 15 on the local server).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_dev_redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
_test_redis = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
if _test_redis.rstrip("/") == _dev_redis.rstrip("/"):
    raise ImproperlyConfigured("TEST_REDIS_URL must differ from REDIS_URL: the tests flush their Redis database")
os.environ["REDIS_URL"] = _test_redis

from config.settings import *  # noqa: E402,F403

SAGAS_LEASE_TTL = 3.0
SAGAS_SWEEP_INTERVAL = 0.5

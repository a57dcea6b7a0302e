from __future__ import annotations

from django.apps import AppConfig


class HarnessConfig(AppConfig):
    """The test suite's own app (config/settings_test.py installs it, nothing else does): its
    ``flush`` command replaces Django's between transactional tests."""

    name = "tests.harness"
    label = "test_harness"

from __future__ import annotations

import pytest

from tests.procs import start_providers

MODULES = "tests.ledger.wf_orders"


class Stack:
    """Providers (a real HTTP process) plus helpers to start workers pointed at them."""

    def __init__(self, procs, url: str) -> None:
        self.procs, self.url = procs, url

    def worker(self, name: str, *args: str, **env: str):
        return self.procs.worker(name, MODULES, *args, DEMO_PROVIDERS_URL=self.url, **env)


@pytest.fixture
def stack(procs, transactional_db, settings):
    url = start_providers(procs)
    settings.DEMO_PROVIDERS_URL = url
    return Stack(procs, url)

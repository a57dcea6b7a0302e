from __future__ import annotations

import pytest

from tests.procs import start_providers

MODULES = "tests.agents.wf_agents"


class Stack:
    """The simulated providers and the model gateway (one real HTTP process), plus workers
    that load the agent workflows and call them."""

    def __init__(self, procs, url: str) -> None:
        self.procs, self.url = procs, url

    def worker(self, name: str, **env: str):
        return self.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=self.url, **env)


@pytest.fixture
def stack(procs, transactional_db, settings):
    url = start_providers(procs)
    settings.DEMO_PROVIDERS_URL = url
    return Stack(procs, url)

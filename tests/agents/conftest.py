from __future__ import annotations

import pytest

MODULES = "tests.agents.wf_agents"


class Stack:
    """The simulated providers and the model gateway (one real HTTP process), plus workers
    that load the agent workflows and call them."""

    def __init__(self, procs, url: str) -> None:
        self.procs, self.url = procs, url

    def worker(self, name: str, **env: str):
        return self.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=self.url, **env)


@pytest.fixture
def stack(transactional_db, providers_url, procs):
    """The session's providers (tests/conftest.py), and workers started by ``procs``; set up
    in this order so that the workers are killed before the tables are emptied."""
    return Stack(procs, providers_url)

from __future__ import annotations

import re

import pytest

from tests.procs import wait_until, worker_env

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
    server = procs.start("providers", ["manage.py", "demo_providers", "--port", "0"], worker_env(""))
    found = wait_until(
        lambda: re.search(r"listening on (http://\S+)", server.log()) or not server.alive(), 20,
        what="the provider server to listen",
    )
    assert server.alive(), server.log()
    settings.DEMO_PROVIDERS_URL = found.group(1)
    return Stack(procs, found.group(1))

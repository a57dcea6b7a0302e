"""The API under test: keys for every role, and daphne serving it on the test database with
the simulated providers and real workers (``api_server``)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from api.keys import apikey_create
from tests.procs import wait_until, worker_env

MODULES = "tests.ledger.wf_sagas,tests.ledger.wf_orders,tests.sagas.wf_engine,tests.api.wf_api"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def problem(self) -> str:
        """The problem type's last segment (``start-conflict``...), or "" for a non-problem answer."""
        if self.headers.get("content-type", "").startswith("application/problem+json"):
            return str(self.body.get("type", "")).rsplit("/", 1)[-1]
        return ""


def http(base: str, method: str, path: str, key: str | None = None, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 60) -> Answer:
    """One real HTTP request to ``base`` + ``/api/v1`` + ``path``."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"{base}/api/v1{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, got, text = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got, text = exc.code, dict(exc.headers), exc.read()
    lowered = {k.lower(): v for k, v in got.items()}
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = text.decode(errors="replace")
    return Answer(status, lowered, parsed)


def login(name: str, *groups: str, **fields: Any):
    """A test Client logged in as a new user ``name`` in ``groups`` (``is_staff=True``...)."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    user = User.objects.create_user(name, password="pw-for-tests", **fields)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def keys(db) -> dict[str, str]:
    """A key per role (``viewer``, ``operator``, ``approver``), a second operator and an
    operator limited to tenant ``acme``: name -> plain key."""
    made = {}
    for name, role, tenants in (("viewer", "viewer", None), ("operator", "operator", None),
                                ("approver", "approver", None), ("operator2", "operator", None),
                                ("acme-operator", "operator", ["acme"])):
        made[name] = apikey_create(name=name, role=role, tenants=tenants)[1]
    return made


class ApiServer:
    def __init__(self, base: str, procs, providers_url: str) -> None:
        self.base, self.procs, self.providers_url = base, procs, providers_url

    def call(self, method: str, path: str, key: str | None = None, body: Any = None, **kwargs: Any) -> Answer:
        return http(self.base, method, path, key, body, **kwargs)

    def worker(self, name: str, **env: str):
        return self.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=self.providers_url, **env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def api_server(transactional_db, providers_url, procs) -> ApiServer:
    """daphne serving the project (the API included) on the test database, with the session's
    providers (tests/conftest.py); daphne and the workers are killed before the tables are emptied."""
    port = _free_port()
    daphne = procs.start("daphne", ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                         worker_env(MODULES, DEMO_PROVIDERS_URL=providers_url))
    wait_until(lambda: "Listening on TCP address" in daphne.log() or not daphne.alive(), 30, what="daphne")
    assert daphne.alive(), daphne.log()
    return ApiServer(f"http://127.0.0.1:{port}", procs, providers_url)

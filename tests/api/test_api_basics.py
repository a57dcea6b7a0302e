"""The API's frame: keys, problem JSON, start and read a run."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.test import Client

from api.keys import apikey_create, apikey_revoke
from operators.models import AuditEntry
from sagas.models import WorkflowRun
from tests.sagas import wf_engine  # noqa: F401  (registers five_steps)

pytestmark = pytest.mark.django_db


def call(method: str, path: str, key: str | None = None, body=None, **headers):
    client = Client()
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if key:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    return getattr(client, method)(f"/api/v1{path}", **kwargs, **extra)


def test_it_starts_a_run_once_per_idempotency_key_and_reads_it_back():
    _, key = apikey_create(name="orders", role="operator")
    first = call("post", "/runs", key, {"workflow": "five_steps", "input": {"a": 1}}, **{"Idempotency-Key": "o-1"})
    assert first.status_code == 201, first.content
    again = call("post", "/runs", key, {"workflow": "five_steps", "input": {"a": 1}}, **{"Idempotency-Key": "o-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = call("post", "/runs", key, {"workflow": "five_steps", "input": {"a": 2}}, **{"Idempotency-Key": "o-1"})
    assert other.status_code == 409 and other["Content-Type"] == "application/problem+json"
    assert other.json()["type"].endswith("/start-conflict")
    assert WorkflowRun.objects.count() == 1
    got = call("get", f"/runs/{first.json()['id']}", key)
    assert got.status_code == 200 and got.json()["status"] == "PENDING" and got.json()["business_key"] == "o-1"
    entry = AuditEntry.objects.get(action="run.start")
    assert entry.actor_label == "system: api key orders"


def test_it_refuses_a_missing_wrong_or_revoked_key_with_problem_json():
    model, key = apikey_create(name="ops", role="viewer")
    assert call("get", "/runs/00000000-0000-0000-0000-000000000000").status_code == 401
    assert call("get", "/runs/x", key[:-2] + "zz").status_code == 401
    assert call("get", "/runs/00000000-0000-0000-0000-000000000000", key).json()["type"].endswith("/not-found")
    denied = call("post", "/runs", key, {"workflow": "five_steps"})
    assert denied.status_code == 403 and AuditEntry.objects.filter(action="run.start", outcome="denied").exists()
    apikey_revoke(key=model, by="t")
    assert call("get", "/runs/00000000-0000-0000-0000-000000000000", key).status_code == 401


def test_it_prints_a_key_once_from_the_command(capsys):
    call_command("createapikey", "billing", "--role", "operator", "--tenant", "acme")
    out = capsys.readouterr().out
    key = next(line for line in out.splitlines() if line.startswith("sk_"))
    assert call("get", "/runs/00000000-0000-0000-0000-000000000000", key).status_code == 404

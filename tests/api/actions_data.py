"""Test data of the API's action tests: a workflow that waits for an approval (driven in-process
with ``sagas.replay.engine.advance``), runs in given states, and an in-process caller."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.test import Client

from api.models import ApiKey
from sagas import Context, start, workflow
from sagas.models import ApprovalRequest, RunStatus, WorkflowRun
from sagas.replay.engine import advance

SECRET = "hunter2-do-not-show"


def _login_payload() -> dict:
    return {"user": "ops", "password": SECRET, "note": "<b>markup</b>"}


@workflow("api_gate", version=1)
def api_gate(ctx: Context, order: dict) -> dict:
    ctx.step("login", _login_payload)
    decision = ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(hours=1))
    return {"approved_by": decision["by"]}


def key_user(name: str):
    return ApiKey.objects.get(name=name).user


def waiting_run(*, key: str = "operator", order: str = "o-1", tenant: str = "default") -> WorkflowRun:
    """An ``api_gate`` run started by ``key``'s user (a secret in its input), WAITING for its
    approval "ship"."""
    run = start("api_gate", {"id": order, "password": SECRET}, business_key=order, tenant=tenant,
                started_by=key_user(key))
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.status
    return run


def approval_of(run: WorkflowRun) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run)


def call(method: str, path: str, key: str | None = None, body: Any = None, *, raw: bytes | None = None,
         **headers: str):
    """One in-process request to ``/api/v1`` + ``path``."""
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if key:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    kwargs = {"data": data, "content_type": "application/json"} if data is not None else {}
    return getattr(Client(), method)(f"/api/v1{path}", **kwargs, **extra)


def problem(response) -> str:
    """The problem type's last segment, after checking the answer is problem JSON."""
    assert response["Content-Type"] == "application/problem+json", (response.status_code, response.content[:300])
    return response.json()["type"].rsplit("/", 1)[-1]


def walk(path: str, key: str) -> list[dict]:
    """Every item of a paged list, following ``next`` links."""
    items, pages = [], 0
    while path:
        answer = call("get", path, key)
        assert answer.status_code == 200, answer.content
        body = answer.json()
        items += body["items"] if "items" in body else body["entries"]
        nxt = body["next"]
        path = nxt.split("/api/v1", 1)[1] if nxt else None
        pages += 1
        assert pages < 100
    return items

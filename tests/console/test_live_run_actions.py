"""The run page's actions region is live: it follows the run's state, so Cancel is no
longer offered once the run completes, and the hint that the run waits for an unknown effect
goes once it no longer does.

Real PostgreSQL, the real Redis channel layer, the real ASGI application, driven with channels'
``WebsocketCommunicator`` (as tests/console/test_live.py); the test process is the worker.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client

from config.asgi import application
from operators import roles
from operators.services.actions import Actor
from operators.services.queues import effect_manual_resolve
from sagas import start
from sagas.replay.engine import Outcome, advance
from sagas.versions.registry import workflow
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db(transaction=True)

REGION = 'id="live-run_actions"'
HINT = "It waits for an unknown effect"


def _same(value):
    return value


@workflow("live_actions_two_steps", version=1)
def live_actions_two_steps(ctx, spec):
    return [ctx.step("a", _same, 1), ctx.step("b", _same, 2)]


def _operator() -> tuple[User, bytes]:
    user = User.objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name=roles.OPERATOR)[0])
    client = Client()
    client.force_login(user)
    return user, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def _socket(run_id, cookie: bytes) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, f"/ws/live/?fragments=run_actions&run={run_id}",
                                 headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])


async def _quiet(socket: WebsocketCommunicator) -> None:
    """Wait until pushes already on their way have arrived."""
    while not await socket.receive_nothing(timeout=1.0):
        await socket.receive_from()


async def _settled(socket: WebsocketCommunicator, done, timeout: float = 3.0) -> str:
    """The first push of the region for which ``done(html)`` holds (earlier ones may have been
    rendered before the change was over)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen = []
    while loop.time() < deadline:
        try:
            html = await socket.receive_from(timeout=max(deadline - loop.time(), 0.01))
        except TimeoutError:
            break
        seen.append(html)
        if REGION in html and done(html):
            return html
    raise AssertionError(f"no such push within {timeout}s; got {seen}")


def test_it_pushes_a_run_page_actions_that_drop_cancel_once_the_run_completes():
    _, cookie = _operator()
    run = start("live_actions_two_steps", {})

    async def scenario():
        socket = _socket(run.id, cookie)
        assert (await socket.connect(timeout=5))[0]
        first = await socket.receive_from(timeout=5)
        assert REGION in first and "Cancel…" in first and "Compensate…" in first
        await _quiet(socket)

        assert await database_sync_to_async(advance)(str(run.id), owner="t") == Outcome.COMPLETED
        pushed = await _settled(socket, lambda html: "Cancel…" not in html)
        assert "Compensate…" not in pushed
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_pushes_a_run_page_without_the_unknown_effect_hint_once_the_effect_is_resolved():
    operator, cookie = _operator()
    run = make_run()  # NEEDS_ATTENTION: effect_unknown
    effect = make_effect(run=run)

    async def scenario():
        socket = _socket(run.id, cookie)
        assert (await socket.connect(timeout=5))[0]
        first = await socket.receive_from(timeout=5)
        assert HINT in first and "Ambiguous effects →" in first
        await _quiet(socket)

        await database_sync_to_async(effect_manual_resolve)(
            Actor(user=operator, ip=None), effect_id=effect.id, outcome="succeeded", downstream_ref="ch_1",
            note="provider dashboard shows ch_1", expected="UNKNOWN")
        pushed = await _settled(socket, lambda html: HINT not in html)
        assert "Cancel…" in pushed  # woken: no longer waiting for the effect, and still cancellable
        await socket.disconnect()

    async_to_sync(scenario)()

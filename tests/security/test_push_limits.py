"""Live pushes are bounded: a section that renders over ``live.PUSH_MAX_BYTES``, or fails to
render, reaches the page as a small notice ("too large to push" / "could not be updated") at the
top of that section, never as nothing and never as a message the channel layer would refuse.

Real PostgreSQL, the real Redis channel layer and the real ASGI application, driven with
channels' ``WebsocketCommunicator`` (as tests/console/test_live.py does).
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.utils import timezone

from config.asgi import application
from console import live, topics
from sagas.models import JournalEntry, RunStatus
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://localhost")


def hostile_history(run, count: int = 100) -> None:
    """``count`` entries whose name, worker and payload are quotes: each character escapes to six
    bytes, so a page of them (the 600-character previews included) is over the push limit."""
    now = timezone.now()
    JournalEntry.objects.bulk_create(
        JournalEntry(run=run, seq=seq, kind="step", name="'" * 200, worker_id="'" * 200,
                     payload={"quote": "'" * 2000}, created_at=now)
        for seq in range(1, count + 1)
    )


def _cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _first_push(query: str, cookie: bytes) -> str:
    socket = WebsocketCommunicator(application, f"/ws/live/?{query}", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await socket.connect(timeout=5)
    assert connected
    try:
        return await socket.receive_from(timeout=10)  # the catch-up push every connection gets
    finally:
        await socket.disconnect()


def test_it_pushes_a_small_notice_instead_of_a_section_over_the_limit(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    hostile_history(run)
    params = {"run": str(run.id), "since": "0"}
    whole = live.FRAGMENTS["run_history"].render(people["viewer"], params)
    assert len(whole.encode()) > live.PUSH_MAX_BYTES  # what used to be sent (or silently lost)

    pushed = async_to_sync(_first_push)(f"fragments=run_history,run_header&run={run.id}&since=0",
                                        _cookie(people["viewer"]))

    assert len(pushed.encode()) < 64 * 1024
    assert 'hx-swap-oob="afterbegin:#live-run_history"' in pushed
    assert 'class="live-stale"' in pushed and "too large to push" in pushed and "Reload the page" in pushed
    assert 'id="live-run_header"' in pushed  # the other section still arrives whole
    assert "'" * 50 not in pushed and "&#x27;" * 50 not in pushed  # none of the oversized section


def test_it_pushes_a_notice_for_a_section_that_fails_to_render(people, monkeypatch):
    def broken(user, params):
        raise ValueError("a template bug")

    monkeypatch.setitem(live.FRAGMENTS, "test_broken", live.Fragment("test_broken", broken, (topics.OVERVIEW,)))

    pushed = async_to_sync(_first_push)("fragments=test_broken,overview", _cookie(people["viewer"]))

    assert 'hx-swap-oob="afterbegin:#live-test_broken"' in pushed and "could not be updated" in pushed
    assert 'id="live-overview"' in pushed


def test_it_pushes_a_section_under_the_limit_as_it_is(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    hostile_history(run, count=5)
    pushed = async_to_sync(_first_push)(f"fragments=run_history&run={run.id}&since=0", _cookie(people["viewer"]))
    assert 'id="live-run_history"' in pushed and "live-stale" not in pushed
    assert pushed.count('class="entry kind-step"') == 5

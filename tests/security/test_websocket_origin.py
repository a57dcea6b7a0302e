"""The live-update websocket checks the page's Origin against ALLOWED_HOSTS in every mode: a page
on another site cannot open a socket with the operator's session cookie (cross-site websocket
hijacking) even with DEBUG on, where ALLOWED_HOSTS used to be "*"."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings

from config.asgi import application
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db(transaction=True)


def _session_cookie(user) -> bytes:
    client = client_for(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _connects(origin: bytes | None, cookie: bytes) -> bool:
    headers = [(b"cookie", cookie)] + ([(b"origin", origin)] if origin is not None else [])
    socket = WebsocketCommunicator(application, "/ws/live/?fragments=overview", headers=headers)
    connected, _ = await socket.connect(timeout=5)
    await socket.disconnect()
    return connected


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (b"http://127.0.0.1:8000", True),
        (b"http://localhost:8000", True),
        (b"https://evil.example", False),
        (b"http://127.0.0.1.evil.example", False),
        (b"null", False),
        (None, False),
    ],
    ids=["loopback", "localhost", "foreign-site", "lookalike-host", "opaque-origin", "no-origin"],
)
def test_it_opens_the_socket_only_for_a_page_of_an_allowed_host(people, origin, accepted):
    cookie = _session_cookie(people["viewer"])
    assert async_to_sync(_connects)(origin, cookie) is accepted

"""A password change or a deactivation ends that user's open live sockets at once, and nothing
more is pushed to them; a socket whose session no longer matches the password is closed before
its next push even if the change came from somewhere that sent no signal."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from django.test import Client

from config.asgi import application
from console import consumers, topics
from operators.roles import VIEWER, ensure_groups
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer() -> User:
    ensure_groups()
    user = User.objects.create_user("vic", password="pw-vic-long-enough")
    user.groups.add(Group.objects.get(name=VIEWER))
    return user


def _socket(user: User) -> WebsocketCommunicator:
    """A socket of a session in which ``user`` logged in (made before the scenario runs)."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    return WebsocketCommunicator(application, "/ws/live/?fragments=overview",
                                 headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])


async def _overview_changed() -> None:
    """A run appears, and the overview's topic says so (as the engine's signals do)."""
    await database_sync_to_async(make_run)()
    await get_channel_layer().group_send(topics.group_for(topics.OVERVIEW),
                                         {"type": topics.EVENT_TYPE, "topic": topics.OVERVIEW})


def _password_changed(user: User) -> None:
    user.set_password("a-brand-new-password-42")
    user.save()


def _deactivated(user: User) -> None:
    user.is_active = False
    user.save()


@pytest.mark.parametrize("change", [_password_changed, _deactivated], ids=["password", "deactivation"])
def test_it_closes_the_users_sockets_when_their_password_changes_or_they_are_deactivated(viewer, change):
    socket = _socket(viewer)

    async def scenario():
        assert (await socket.connect(timeout=5))[0]
        assert 'id="live-overview"' in await socket.receive_from(timeout=5)

        await database_sync_to_async(change)(viewer)
        # Closed by the account change itself, without waiting for a push.
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close",
                                                          "code": consumers.CLOSE_SESSION_ENDED}
        await _overview_changed()  # would push the overview to an open socket
        assert await socket.receive_nothing(timeout=1.0)

    async_to_sync(scenario)()


def test_it_pushes_nothing_to_a_session_whose_password_changed_without_a_signal(viewer):
    """A password written by a bulk update (no model signal) is caught before the next push."""
    socket = _socket(viewer)

    async def scenario():
        assert (await socket.connect(timeout=5))[0]
        await socket.receive_from(timeout=5)

        await database_sync_to_async(
            User.objects.filter(pk=viewer.pk).update)(password=make_password("another-new-password-42"))
        await _overview_changed()
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close",
                                                          "code": consumers.CLOSE_SESSION_ENDED}
        assert await socket.receive_nothing(timeout=0.5)

    async_to_sync(scenario)()


def test_it_keeps_pushing_to_a_user_whose_account_changed_in_ways_that_keep_their_access(viewer):
    socket = _socket(viewer)

    async def scenario():
        assert (await socket.connect(timeout=5))[0]
        first = await socket.receive_from(timeout=5)

        def touch() -> None:
            viewer.first_name = "Vic"
            viewer.is_staff = True
            viewer.save()

        await database_sync_to_async(touch)()
        await _overview_changed()
        pushed = await socket.receive_from(timeout=5)
        assert 'id="live-overview"' in pushed and pushed != first
        await socket.disconnect()

    async_to_sync(scenario)()

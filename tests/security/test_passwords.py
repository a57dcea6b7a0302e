"""Passwords: Django's four standard validators (similar to the username, shorter than 12
characters, common, all digits), enforced by ``manage.py createuser``, which then creates or
changes nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command
from django.test import RequestFactory

pytestmark = pytest.mark.django_db


def createuser(username: str, password: str | None, **options) -> str:
    from io import StringIO

    out = StringIO()
    call_command("createuser", username, role=["viewer"], password=password, stdout=out, **options)
    return out.getvalue()


@pytest.mark.parametrize(
    ("username", "password", "messages"),
    [
        ("alice", "a", ["This password is too short. It must contain at least 12 characters."]),
        ("alice", "password", ["at least 12 characters", "This password is too common."]),
        ("alice", "314159265358979", ["This password is entirely numeric."]),
        ("margaret.hamilton", "margaret.hamilton!", ["The password is too similar to the username."]),
        ("alice", "1qaz2wsx3edc", ["This password is too common."]),
    ],
    ids=["one-letter", "common-and-short", "numeric", "like-the-username", "common-keyboard-walk"],
)
def test_it_refuses_a_weak_password_with_the_validators_messages_and_creates_nobody(username, password, messages):
    with pytest.raises(CommandError) as refused:
        createuser(username, password)
    for message in messages:
        assert message in str(refused.value)
    assert "nothing was changed" in str(refused.value)
    assert not get_user_model().objects.filter(username=username).exists()


def test_it_keeps_an_existing_users_password_when_the_new_one_is_refused():
    createuser("alice", "a-long-and-uncommon-passphrase")
    with pytest.raises(CommandError):
        createuser("alice", "alice")
    request = RequestFactory().post("/login/")
    assert authenticate(request, username="alice", password="a-long-and-uncommon-passphrase") is not None


def test_it_creates_a_user_with_a_strong_or_a_generated_password():
    assert "created alice (viewer)" in createuser("alice", "a-long-and-uncommon-passphrase")
    out = createuser("bob", None)
    generated = out.rsplit("password: ", 1)[1].strip()
    assert len(generated) >= 12
    request = RequestFactory().post("/login/")
    assert authenticate(request, username="bob", password=generated) is not None

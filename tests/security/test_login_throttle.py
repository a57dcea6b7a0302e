"""Login throttling (django-axes): five wrong passwords for one username from one address lock that
pair out, even for the right password, with a page that says when to try again; other addresses
and other usernames still log in; the lockout is in the audit log."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from operators.models import AuditEntry
from operators.roles import VIEWER, ensure_groups

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-and-uncommon-passphrase"


@pytest.fixture(autouse=True)
def _fast_hasher(settings):
    """Some thirty password checks per test: the real hasher would take most of a minute."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def viewer(username: str):
    ensure_groups()
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    user.groups.add(Group.objects.get(name=VIEWER))
    return user


@pytest.fixture
def lena():
    return viewer("lena")


def log_in(client: Client, username: str, password: str):
    return client.post("/login/", {"username": username, "password": password})


def logged_in(client: Client) -> bool:
    return settings.SESSION_COOKIE_NAME in client.cookies and client.get("/").status_code == 200


def test_it_locks_out_a_username_and_address_after_five_wrong_passwords_even_for_the_right_one(lena):
    client = Client()
    answers = [log_in(client, "lena", f"wrong-{i}") for i in range(5)]
    assert [a.status_code for a in answers[:4]] == [200] * 4
    assert all("Wrong username or password" in a.content.decode() for a in answers[:4])

    right = log_in(client, "lena", PASSWORD)

    assert answers[4].status_code == 429 and right.status_code == 429
    page = right.content.decode()
    assert "Too many failed logins" in page and "Try again in 15 minutes." in page
    assert not logged_in(client)


def test_it_still_lets_the_same_user_in_from_another_address_and_others_from_the_same(lena):
    other = viewer("omar")
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for i in range(6):
        log_in(attacker, "lena", f"guess-{i}")
    assert log_in(attacker, "lena", PASSWORD).status_code == 429

    elsewhere, colleague = Client(REMOTE_ADDR="198.51.100.20"), Client(REMOTE_ADDR="203.0.113.7")
    assert log_in(elsewhere, "lena", PASSWORD).status_code == 302 and logged_in(elsewhere)
    assert log_in(colleague, other.username, PASSWORD).status_code == 302 and logged_in(colleague)


def test_it_audits_the_lockout_once_with_the_username_tried_and_the_address(lena):
    client = Client(REMOTE_ADDR="203.0.113.7")
    for i in range(9):  # five to lock out, four more while locked out
        log_in(client, "lena", f"guess-{i}")

    [entry] = AuditEntry.objects.filter(action="auth.lockout")
    assert (entry.actor, entry.actor_label, entry.ip, entry.outcome) == (None, "lena", "203.0.113.7", "denied")
    assert entry.object_type == "user" and entry.object_id == "lena"
    assert "5 failed logins" in entry.message and "15 minutes" in entry.message


def test_it_counts_afresh_after_a_successful_login_and_after_the_cool_off(lena):
    client = Client()
    for i in range(4):
        log_in(client, "lena", f"wrong-{i}")
    assert log_in(client, "lena", PASSWORD).status_code == 302  # resets the count
    client.post("/logout/")
    for i in range(4):
        assert log_in(client, "lena", f"again-{i}").status_code == 200

    assert log_in(client, "lena", "wrong-once-more").status_code == 429
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16))
    assert log_in(client, "lena", PASSWORD).status_code == 302 and logged_in(client)

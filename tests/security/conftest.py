"""Shared fixtures of the security tests: the console's role users (``people``, reused from
tests/console/conftest.py, plus a superuser) and a logged-in client per role."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.console.conftest import client_for, people  # noqa: F401  (fixtures are found by name)

ROLES = ("anonymous", "viewer", "operator", "approver", "superuser")


@pytest.fixture
def superuser():
    user = get_user_model()(username="sue", is_superuser=True, is_staff=True)
    user.set_unusable_password()  # the clients log in with force_login
    user.save()
    return user


@pytest.fixture
def clients(people, superuser) -> dict[str, Client]:
    """A client per name of ``ROLES`` (anonymous: not logged in)."""
    by_role = {"viewer": people["viewer"], "operator": people["operator"], "approver": people["approver"],
               "superuser": superuser}
    return {"anonymous": Client(), **{role: client_for(user) for role, user in by_role.items()}}

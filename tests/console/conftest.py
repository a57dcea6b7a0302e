from __future__ import annotations

import functools

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from operators.roles import APPROVER, OPERATOR, VIEWER, ensure_groups


@functools.cache
def _hash(password: str) -> str:
    from django.contrib.auth.hashers import make_password

    return make_password(password)  # the real hasher is slow; hash each password once


@pytest.fixture
def people():
    """One user per role (two operators and two approvers, for races and four-eyes), and one without."""
    ensure_groups()

    def make(name: str, *roles: str):
        user = get_user_model().objects.create(username=name, password=_hash(f"pw-{name}-long"))
        for role in roles:
            user.groups.add(Group.objects.get(name=role))
        return user

    return {
        "viewer": make("vera", VIEWER),
        "operator": make("olga", OPERATOR),
        "operator2": make("oscar", OPERATOR),
        "approver": make("ann", APPROVER),
        "approver2": make("abe", APPROVER),
        "nobody": make("nils"),
    }


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client

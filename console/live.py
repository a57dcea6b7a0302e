"""Live pages: the contract between pages and the websocket transport.

A page declares its live regions with ``live_context(["runs_table"], **params)``
(console/views/base.py). Each region is a fragment: a template whose root element
has ``id="live-<name>"``, rendered by a function registered here with
``@fragment("<name>")`` taking ``(user, params)`` and returning HTML. The same
fragment serves the full page (the page template includes it), the htmx swap and
the websocket push (the consumer re-renders it and sends it; htmx-ext-ws swaps it
in by id).

``broadcast(*topics)`` tells open pages that data changed; it is called after
commit. The transport (consumer, routing, publishing) lives in console/consumers.py
and console/routing.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

FragmentFn = Callable[[AbstractBaseUser, dict[str, str]], str]
_fragments: dict[str, FragmentFn] = {}


def fragment(name: str) -> Callable[[FragmentFn], FragmentFn]:
    def register(fn: FragmentFn) -> FragmentFn:
        _fragments[name] = fn
        return fn

    return register


def render_fragment(name: str, user: AbstractBaseUser, params: dict[str, str]) -> str:
    return _fragments[name](user, params)


def known_fragments() -> set[str]:
    return set(_fragments)


def broadcast(*topics: str, **info: Any) -> None:
    """Replaced by the transport at import time (console/consumers.py); a no-op until then."""

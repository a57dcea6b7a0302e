"""Live pages: every live fragment of the console, the topics it follows, and how it renders.

A page declares its live regions with ``live_context(["runs_table"], **params)``
(console/views/base.py). Each region is a fragment: a template whose root element has
``id="live-<name>"``, rendered by a function of its page's view module taking
``(user, params)`` (``params``: the page's query string) and returning HTML. The same
fragment serves the full page (the page template includes it), the htmx swap and the
websocket push (the consumer, console/consumers.py, re-renders it and sends it; htmx-ext-ws
swaps it in by id).

``FRAGMENTS`` below is the one list of them: a fragment is live only if it is listed here,
with the topics (console/topics.py) after which it must be rendered again. Publishing is in
console/broadcast.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser

from console import topics
from console.views import audit, overview, queues, run_detail, run_list, versions

FragmentFn = Callable[[AbstractBaseUser, dict[str, str]], str]


@dataclass(frozen=True)
class Fragment:
    name: str
    render: FragmentFn
    follows: tuple[str, ...]  # topic names; topics.THIS_RUN: the run named by the page's ``run`` param


def _by_name(*fragments: Fragment) -> dict[str, Fragment]:
    return {f.name: f for f in fragments}


FRAGMENTS: dict[str, Fragment] = _by_name(
    Fragment(overview.OVERVIEW, overview.overview_fragment, (topics.OVERVIEW,)),
    Fragment(run_list.RUNS_TABLE, run_list.runs_table_fragment, (topics.RUNS,)),
    Fragment(run_detail.RUN_HEADER, run_detail.run_header_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_HISTORY, run_detail.run_history_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_EFFECTS, run_detail.run_effects_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_APPROVALS, run_detail.run_approvals_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_COMPENSATION, run_detail.run_compensation_fragment, (topics.THIS_RUN,)),
    Fragment(queues.EFFECTS_FRAGMENT, queues.effects_fragment, (topics.EFFECTS,)),
    Fragment(queues.APPROVALS_FRAGMENT, queues.approvals_fragment, (topics.APPROVALS,)),
    Fragment(versions.VERSIONS_FRAGMENT, versions.versions_fragment, (topics.RUNS,)),  # runs in flight per hash
    Fragment(audit.AUDIT_FRAGMENT, audit.audit_fragment, (topics.AUDIT,)),
)


def render_fragment(name: str, user: AbstractBaseUser, params: dict[str, str]) -> str:
    return FRAGMENTS[name].render(user, params)


def topics_for(name: str, params: Mapping[str, str]) -> list[str]:
    """The topics after which fragment ``name`` is rendered again, for a page with ``params``
    (``params["run"]``, if any, already checked to be a run id)."""
    resolved = []
    for topic in FRAGMENTS[name].follows:
        if topic != topics.THIS_RUN:
            resolved.append(topic)
        elif params.get("run"):
            resolved.append(topics.run_topic(params["run"]))
    return resolved

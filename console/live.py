"""Live pages: every live fragment of the console, the topics it follows, and how it renders.

A page declares its live regions with ``live_context(["runs_table"], **params)``
(console/views/base.py). Each region is a fragment: a template whose root element has
``id="live-<name>"``, rendered by a function of its page's view module taking
``(user, params)`` (``params``: the page's query string) and returning HTML. The same
fragment serves the full page (the page template includes it), the htmx swap and the
websocket push (the consumer, console/consumers.py, re-renders it and sends it; htmx-ext-ws
swaps it in by id, morphing it: console/static/console/live_morph.js keeps focus, open
sections and anything being typed). A fragment never carries the result of an action: those are
messages outside the regions (console/views/notices.py), which pushes leave alone.

``FRAGMENTS`` below is the one list of them: a fragment is live only if it is listed here,
with the topics (console/topics.py) after which it must be rendered again. Publishing is in
console/broadcast.py.

A push is bounded: ``render_fragment`` never returns more than ``PUSH_MAX_BYTES`` (UTF-8). A
fragment that renders larger, or whose rendering fails for a reason other than our storage
being away, is replaced by a small notice (``console/live_stale.html``) inserted at the top of
the region already on the page: the region keeps what it showed, says it is out of date, and
the live indicator says "live updates paused" (console/static/console/console.js) until a
later push replaces the region. Each fragment's first oversize or failure is logged, not every
push of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.template.loader import render_to_string

from console import topics
from console.views import audit, bulk, connectors, overview, queues, run_detail, run_list, versions, workers
from core.storage import is_storage_error

FragmentFn = Callable[[User, dict[str, str]], str]

log = logging.getLogger("console.live")

# Half the channel layer's default message limit (channels_redis: 1 MiB), and more than any page
# of truncated payloads (console/templatetags/payloads.py) renders to.
PUSH_MAX_BYTES = 512 * 1024
TOO_LARGE = "too_large"
FAILED = "failed"


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
    Fragment(run_detail.RUN_ACTIONS, run_detail.run_actions_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_HISTORY, run_detail.run_history_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_EFFECTS, run_detail.run_effects_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_APPROVALS, run_detail.run_approvals_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_COMPENSATION, run_detail.run_compensation_fragment, (topics.THIS_RUN,)),
    Fragment(run_detail.RUN_CONVERSATION, run_detail.run_conversation_fragment, (topics.THIS_RUN,)),
    # A parent's children: they move without their parent (a child's start, end or wait is its own
    # change), so the region follows every run's; the page subscribes to it only for a run that has
    # children or may still start some (console/views/run_detail.py). Two bounded queries a push.
    Fragment(run_detail.RUN_CHILDREN, run_detail.run_children_fragment, (topics.THIS_RUN, topics.RUNS)),
    Fragment(queues.EFFECTS_FRAGMENT, queues.effects_fragment, (topics.EFFECTS,)),
    Fragment(queues.APPROVALS_FRAGMENT, queues.approvals_fragment, (topics.APPROVALS,)),
    Fragment(versions.VERSIONS_FRAGMENT, versions.versions_fragment, (topics.RUNS,)),  # runs in flight per hash
    Fragment(audit.AUDIT_FRAGMENT, audit.audit_fragment, (topics.AUDIT,)),
    Fragment(bulk.BULK_FRAGMENT, bulk.bulk_batch_fragment, (topics.BULK,)),  # a batch's progress
    # Runs held and stranded versions move with runs; heartbeats publish nothing: the region also polls.
    Fragment(workers.WORKERS_FRAGMENT, workers.workers_fragment, (topics.RUNS,)),
    # Circuits and operators' changes publish; calls held, let go, sent or answered do not (under
    # load they move every few milliseconds): the region also polls.
    Fragment(connectors.CONNECTORS_FRAGMENT, connectors.connectors_fragment, (topics.CONNECTORS,)),
)


_noted: set[tuple[str, str]] = set()  # (fragment, why) already logged by this process


def render_fragment(name: str, user: User, params: dict[str, str]) -> str:
    """Fragment ``name`` as pushed: its HTML, or the stale notice when that would be more than
    ``PUSH_MAX_BYTES`` or its rendering failed. Storage errors are raised (the consumer handles
    outages)."""
    try:
        html = FRAGMENTS[name].render(user, params)
    except Exception as exc:
        if is_storage_error(exc):
            raise
        if (name, FAILED) not in _noted:
            _noted.add((name, FAILED))
            log.exception("live fragment %r failed to render (params %r); pushing a notice", name, params)
        return stale_notice(name, FAILED)
    size = len(html.encode("utf-8"))
    if size <= PUSH_MAX_BYTES:
        return html
    if (name, TOO_LARGE) not in _noted:
        _noted.add((name, TOO_LARGE))
        log.warning("live fragment %r is %d bytes, over the %d-byte push limit; pushing a notice instead",
                    name, size, PUSH_MAX_BYTES)
    return stale_notice(name, TOO_LARGE)


def stale_notice(name: str, why: str) -> str:
    """A small push that tells the page region ``live-<name>`` it is out of date."""
    return render_to_string("console/live_stale.html", {"fragment": name, "too_large": why == TOO_LARGE})


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

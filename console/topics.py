"""Live-update topics: the names of what can change, shared by the publisher
(console/broadcast.py), the fragment registry (console/live.py) and the consumer.

A topic is a name: ``runs`` (any run changed), ``effects``, ``approvals``, ``audit``,
``overview``, ``bulk``, ``connectors``, ``run.<uuid>`` for one run, and ``user.<id>`` for one user's access (their
password, roles, tenants or active flag changed: their open sockets check it again). Each topic
is one channel-layer group (``live.<topic>``), and an event on it says only "look again" (``EVENT_TYPE``).
"""

from __future__ import annotations

import uuid
from typing import Any

RUNS = "runs"
EFFECTS = "effects"
APPROVALS = "approvals"
AUDIT = "audit"
OVERVIEW = "overview"
BULK = "bulk"  # a bulk batch moved on (console/services/bulk.py): its page looks again
# Flow control changed: a circuit opened, went half-open or closed, or an operator changed a
# connector (console/broadcast.py). The connectors page looks again.
CONNECTORS = "connectors"
LIST_TOPICS = (RUNS, EFFECTS, APPROVALS, AUDIT, OVERVIEW, BULK, CONNECTORS)

# In a fragment's ``follows``: the topic of the run its page shows (``run.<the page's run param>``).
THIS_RUN = "run"

USER = "user"  # ``user.<id>``: see user_topic

EVENT_TYPE = "live.changed"  # routed to LiveConsumer.live_changed


def run_topic(run_id: Any) -> str:
    return f"run.{str(run_id).lower()}"


def user_topic(user_id: Any) -> str:
    return f"{USER}.{int(user_id)}"


def group_for(topic: str) -> str:
    return f"live.{topic}"


def is_topic(topic: str) -> bool:
    """A list topic, ``run.`` and a run id in canonical form, or ``user.`` and a user id."""
    if topic in LIST_TOPICS:
        return True
    kind, _, run_id = topic.partition(".")
    if kind == USER:
        return run_id.isascii() and run_id.isdigit() and str(int(run_id)) == run_id
    if kind != THIS_RUN:
        return False
    try:
        return str(uuid.UUID(run_id)) == run_id
    except ValueError:
        return False

"""RQ job entry points. They take ids, never model instances."""

from __future__ import annotations

from django.db import close_old_connections

from sagas import engine, queue


def advance(run_id: str) -> str:
    queue.clear_marker(run_id)
    # Drop a connection that broke since the last job (Django checks it lazily).
    close_old_connections()
    return engine.advance(run_id).value

"""RQ job entry points. They take ids, never model instances."""

from __future__ import annotations

from django.db import close_old_connections

from sagas import engine, queue


def advance(run_id: str) -> str:
    queue.clear_marker(run_id)
    close_old_connections()
    try:
        return engine.advance(run_id).value
    finally:
        close_old_connections()

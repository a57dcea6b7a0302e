"""Saga Console's durable execution engine. Public API:

    from sagas import workflow, start, Context
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sagas.errors import NonDeterminismError, StepFailed
from sagas.registry import workflow

if TYPE_CHECKING:
    from sagas.context import Context
    from sagas.models import WorkflowRun

__all__ = ["workflow", "start", "Context", "NonDeterminismError", "StepFailed"]


def start(name: str, input: Any = None, **options: Any) -> WorkflowRun:
    """Start a run of workflow ``name``; see ``sagas.services.run_start`` for options."""
    from sagas.services import run_start

    return run_start(name=name, input=input, **options)


def workers(*, include_stopped: bool = False) -> list:
    """The workers in the registry; see ``sagas.readiness.workers_status``."""
    from sagas.readiness import workers_status

    return workers_status(include_stopped=include_stopped)


def __getattr__(attr: str) -> Any:
    if attr == "Context":
        from sagas.context import Context

        return Context
    raise AttributeError(attr)

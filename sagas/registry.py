"""The in-process registry of workflow definitions, and their discovery.

A definition is identified by ``(name, version)``. Its ``definition_hash`` is the
SHA-256 of the decorated function's source (dedented, trailing blanks removed).
A run records the hash it started with; a worker refuses to resume it under a
different hash (``VersionMismatch``). The hash covers the workflow function's
own source only: a change in a helper it calls is not detected, which is what
``ctx.step`` journaling and non-determinism detection are for.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sagas.errors import DuplicateWorkflow, WorkflowNotRegistered

log = logging.getLogger("sagas.registry")

ON_FAILURE_CHOICES = ("compensate", "park")


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    version: int
    fn: Callable[..., Any]
    definition_hash: str
    source: str
    module: str
    max_steps: int | None = None
    max_cost: float | None = None
    max_duration: timedelta | None = None
    on_failure: str = "compensate"
    approve_irreversible: bool = True


_registry: dict[tuple[str, int], WorkflowDefinition] = {}


def source_of(fn: Callable[..., Any]) -> str:
    try:
        raw = inspect.getsource(fn)
    except (OSError, TypeError):  # defined in a REPL or exec(): hash the bytecode instead
        raw = repr(fn.__code__.co_code) + repr(fn.__code__.co_consts)
    lines = [line.rstrip() for line in textwrap.dedent(raw).splitlines()]
    return "\n".join(lines).strip() + "\n"


def hash_source(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def workflow(
    name: str,
    *,
    version: int = 1,
    max_steps: int | None = None,
    max_cost: float | None = None,
    max_duration: timedelta | None = None,
    on_failure: str = "compensate",
    approve_irreversible: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(ctx, input)`` as version ``version`` of workflow ``name``.

    Several versions of one name may be registered side by side; each run
    resumes on the version it started with. Registering a *different* function
    under an existing ``(name, version)`` in one process raises
    ``DuplicateWorkflow``.
    """
    if not name or not isinstance(name, str):
        raise ValueError("workflow name must be a non-empty string")
    if not isinstance(version, int) or version < 1:
        raise ValueError("workflow version must be a positive integer")
    if on_failure not in ON_FAILURE_CHOICES:
        raise ValueError(f"on_failure must be one of {ON_FAILURE_CHOICES}, not {on_failure!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        source = source_of(fn)
        definition = WorkflowDefinition(
            name=name,
            version=version,
            fn=fn,
            definition_hash=hash_source(source),
            source=source,
            module=fn.__module__,
            max_steps=max_steps,
            max_cost=max_cost,
            max_duration=max_duration,
            on_failure=on_failure,
            approve_irreversible=approve_irreversible,
        )
        existing = _registry.get((name, version))
        if existing is not None and existing.definition_hash != definition.definition_hash:
            raise DuplicateWorkflow(
                f"workflow {name!r} version {version} is already registered from {existing.module} "
                f"with a different definition; bump the version instead"
            )
        _registry[(name, version)] = definition
        fn.__saga_workflow__ = definition  # type: ignore[attr-defined]
        return fn

    return decorate


def get(name: str, version: int | None = None) -> WorkflowDefinition:
    """The definition for ``(name, version)``; the highest version when ``version`` is None."""
    if version is None:
        versions = [v for (n, v) in _registry if n == name]
        if not versions:
            raise WorkflowNotRegistered(f"no workflow named {name!r} is registered")
        version = max(versions)
    try:
        return _registry[(name, version)]
    except KeyError:
        raise WorkflowNotRegistered(f"workflow {name!r} version {version} is not registered") from None


def find(name: str, version: int) -> WorkflowDefinition | None:
    return _registry.get((name, version))


def all_definitions() -> list[WorkflowDefinition]:
    return sorted(_registry.values(), key=lambda d: (d.name, d.version))


def autodiscover(extra_modules: list[str]) -> None:
    """Import ``workflows`` from every installed app, then each module in ``extra_modules``."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("workflows")
    for module in extra_modules:
        importlib.import_module(module)

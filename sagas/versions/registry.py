"""The in-process registry of workflow definitions, and their discovery.

A definition is identified by ``(name, version)``. A run records the definition's
``definition_hash`` when it starts; runs are routed only to workers registered with that
hash, and a worker refuses to resume a run under another one (``VersionMismatch``).

The hash covers the source of the workflow's whole module (``sagas.versions.definition_hash``):
its imports, constants, helpers and classes and the workflow function itself, but not the
other ``@workflow`` definitions in it, nor comments, docstrings or blank lines. Editing a
helper in the module therefore gives the workflow a new hash, as editing the function
does; adding a new version beside an unchanged old one leaves the old one's hash alone.
Not covered: code imported from other modules (helpers, step functions, connectors,
libraries), data files, settings. ``source`` is the recorded text (the module, minus the
other workflows) that the console diffs between versions.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sagas.errors import DuplicateWorkflow, InvalidArgument, WorkflowNotRegistered
from sagas.schedules.spec import ScheduleSpec
from sagas.summaries import Spec, summary_spec_check
from sagas.versions.definition_hash import definition_hash, definition_source, function_source

log = logging.getLogger("sagas.versions.registry")

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
    # The hash of releases before the whole-module hash: the function's own source
    # (``function_source``). Runs started under it resume on this definition while that
    # source is unchanged, so upgrading Saga Console strands no run in flight.
    legacy_hash: str = ""
    # What a person needs to know about a run (sagas.summaries): a function of the input, or
    # a tuple of input field names; None: no summary.
    summary: Callable[[Any], Any] | tuple[str, ...] | None = None
    # How long its finished runs are kept before retention archives them (sagas.retention.archiving);
    # None: the SAGAS_RETENTION_DAYS setting.
    retention: timedelta | None = None
    # Which of its runs a saturated worker takes first, 1 (first) to 5; a start may say otherwise.
    priority: int = 3
    # The schedules that start it (sagas.schedules), synced to the database when a worker starts.
    schedules: tuple[ScheduleSpec, ...] = ()

    @property
    def accepted_hashes(self) -> frozenset[str]:
        """The run hashes this definition resumes: its own, and the legacy one."""
        return frozenset(h for h in (self.definition_hash, self.legacy_hash) if h)


_registry: dict[tuple[str, int], WorkflowDefinition] = {}


def workflow(
    name: str,
    *,
    version: int = 1,
    max_steps: int | None = None,
    max_cost: float | None = None,
    max_duration: timedelta | None = None,
    on_failure: str = "compensate",
    approve_irreversible: bool = True,
    summary: Spec | None = None,
    retention: timedelta | None = None,
    priority: int = 3,
    schedules: list[ScheduleSpec] | tuple[ScheduleSpec, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(ctx, input)`` as version ``version`` of workflow ``name``.

    Several versions of one name may be registered side by side; each run
    resumes on the version it started with. The definition's hash covers the
    function's whole module (see the module docstring). Registering a definition
    with another hash under an existing ``(name, version)`` in one process raises
    ``DuplicateWorkflow``.

    ``summary``: what a person needs to know about a run to decide about it (an order id, a
    customer, an amount). Either a function ``summary(input) -> dict``, or a list of input
    field names (dotted paths into nested dicts, ``"customer.name"``; a digit indexes a list).
    It is computed from the input when the run starts, stored on the run
    (``WorkflowRun.summary``) and shown by the console, redacted, wherever someone decides
    about the run. A function that raises or returns something that is not a JSON object does
    not fail the start: the run stores ``{"_summary_error": "..."}`` and the failure is logged
    once (``sagas.summaries``). Being in the decorator, it is part of the definition's source
    and hash. A malformed ``summary`` (neither) raises ``ValueError`` here.

    ``retention``: how long after it finishes a run of this definition is kept before
    retention archives and deletes it (``sagas.retention.archiving``); default: ``SAGAS_RETENTION_DAYS``.

    ``priority``: which runs a worker with more work than threads takes first: 1 first, 5 last,
    3 by default (``start(..., priority=)`` may say otherwise per run). It orders the runs
    waiting for a worker, not the calls waiting at a connector's limits (``ledger.flow``).

    ``schedules``: ``sagas.schedule(...)`` specs that start this workflow on a calendar; each
    worker creates or updates them in the database when it starts (``sagas.schedules``). Only
    the newest version of a workflow registered in a process declares its schedules. A
    malformed one raises ``ValueError`` (``InvalidArgument``) here.
    """
    if not name or not isinstance(name, str):
        raise ValueError("workflow name must be a non-empty string")
    if not isinstance(version, int) or version < 1:
        raise ValueError("workflow version must be a positive integer")
    if on_failure not in ON_FAILURE_CHOICES:
        raise ValueError(f"on_failure must be one of {ON_FAILURE_CHOICES}, not {on_failure!r}")
    summary_spec = summary_spec_check(summary)
    if retention is not None and (not isinstance(retention, timedelta) or retention < timedelta(0)):
        raise ValueError("retention must be a timedelta of zero or more")
    if isinstance(priority, bool) or priority not in (1, 2, 3, 4, 5):
        raise ValueError(f"priority must be a whole number from 1 (taken first) to 5, not {priority!r}")

    declared = tuple(_schedule_check(name, spec) for spec in schedules)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        source = definition_source(fn)
        definition = WorkflowDefinition(
            name=name,
            version=version,
            fn=fn,
            definition_hash=definition_hash(source),
            source=source,
            module=fn.__module__,
            max_steps=max_steps,
            max_cost=max_cost,
            max_duration=max_duration,
            on_failure=on_failure,
            approve_irreversible=approve_irreversible,
            legacy_hash=hashlib.sha256(function_source(fn).encode("utf-8")).hexdigest(),
            summary=summary_spec,
            retention=retention,
            priority=priority,
            schedules=declared,
        )
        existing = _registry.get((name, version))
        if existing is not None and existing.definition_hash != definition.definition_hash:
            raise DuplicateWorkflow(
                f"workflow {name!r} version {version} is registered twice, with different definitions: "
                f"from {existing.module} and from {definition.module}; bump the version or rename one"
            )
        _registry[(name, version)] = definition
        fn.__saga_workflow__ = definition  # type: ignore[attr-defined]
        return fn

    return decorate


def _schedule_check(name: str, spec: Any) -> ScheduleSpec:
    if not isinstance(spec, ScheduleSpec):
        raise InvalidArgument(f"workflow {name!r}: schedules takes sagas.schedule(...) specs, not {spec!r}")
    if spec.workflow and spec.workflow != name:
        raise InvalidArgument(f"workflow {name!r}: schedule {spec.name!r} starts {spec.workflow!r}")
    return replace(spec, workflow=name).checked()


def declared_schedules() -> list[ScheduleSpec]:
    """The schedules of the newest version of each workflow registered here."""
    newest: dict[str, WorkflowDefinition] = {}
    for definition in _registry.values():
        if definition.name not in newest or definition.version > newest[definition.name].version:
            newest[definition.name] = definition
    return [spec for d in sorted(newest.values(), key=lambda d: d.name) for spec in d.schedules]


@contextmanager
def apart() -> Iterator[list[WorkflowDefinition]]:
    """Workflows defined inside this block (a module imported for the replay check, code not
    deployed yet) go into the list it yields, filled when the block ends, instead of into this
    process's registry, which is left as it was. Not for use while other threads import
    workflow modules."""
    global _registry
    saved, _registry = _registry, {}
    found: list[WorkflowDefinition] = []
    try:
        yield found
    finally:
        found.extend(_registry.values())
        _registry = saved


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

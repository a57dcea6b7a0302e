"""Named crash points, for tests that must kill a worker at an exact place.

``SAGAS_CRASH_AT`` (environment, comma-separated) lists ``point`` or
``point:name`` entries. When the engine reaches a listed point it ends the
process with ``os._exit(CRASH_EXIT_CODE)``: no cleanup, no ``finally``, no
commit, exactly like a SIGKILL at that instruction.

Points:
  before_step        a step is about to call its function (nothing recorded yet)
  after_step         the function returned; its result is not journaled yet
  after_step_record  the result is journaled
  before_complete    the workflow returned; the run is not marked COMPLETED yet
Effect points (the ledger) use the same mechanism.

In-process, ``sagas.testing.crash_at`` sets ``in_process_hook``, which is called first at
every point and raises there instead of ending the process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from django.conf import settings

CRASH_EXIT_CODE = 97
log = logging.getLogger("sagas.crash")

_points: frozenset[str] | None = None

# Every point the engine and the ledger reach (the first argument of each crash_point call).
POINTS = frozenset({
    "before_step", "after_step", "after_step_record",  # sagas.replay.context: ctx.step
    "before_complete", "before_continue_as_new", "before_tree_report",  # sagas.replay.engine
    "continue_as_new_uncommitted", "after_continue_as_new",  # sagas.replay.continuation
    "child_start_uncommitted", "after_child_start",  # sagas.children: ctx.start_child
    "before_compensation",  # sagas.compensation
    "before_intent", "after_intent", "after_dispatch", "after_outcome",  # ledger.protocol: ctx.effect
})

# Called first at every point with (point, name) when set; it may raise (sagas.testing.crash_at).
in_process_hook: Callable[[str, str], None] | None = None


def _configured() -> frozenset[str]:
    global _points
    if _points is None:
        _points = frozenset(settings.SAGAS_CRASH_AT)
    return _points


def crash_point(point: str, name: str = "") -> None:
    hook = in_process_hook
    if hook is not None:
        hook(point, name)
    points = _configured()
    if not points:
        return
    if point in points or f"{point}:{name}" in points:
        msg = f"crash point {point}:{name} reached in pid {os.getpid()}: exiting with {CRASH_EXIT_CODE}"
        log.warning(msg)
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

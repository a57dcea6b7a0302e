"""Workflows of the workers page and metrics tests. Worker processes load them with SAGAS_MODULES."""

from __future__ import annotations

import time

from sagas import Context, StepFailed, workflow


def _hold(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _ok() -> str:
    return "ok"


def _boom() -> None:
    raise RuntimeError("the step failed on purpose")


@workflow("wk_hold", version=1)
def wk_hold(ctx: Context, spec: dict) -> str:
    """One step that takes ``seconds``: the run stays held (RUNNING, leased) that long."""
    ctx.step("hold", _hold, spec.get("seconds", 0.0))
    return "held"


@workflow("wk_quick", version=1)
def wk_quick(ctx: Context, spec: dict) -> str:
    """Two steps: one succeeds, one fails (handled): one of each outcome in the journal."""
    ctx.step("one", _ok)
    try:
        ctx.step("two", _boom)
    except StepFailed:
        pass
    return "done"

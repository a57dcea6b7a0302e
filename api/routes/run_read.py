"""Reading one run, and waiting for it to finish (``GET /runs/{id}``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from api.errors import Problem
from api.routes.runs import RunOut, run_out
from console.selectors.runs import run_get

router = Router(tags=["runs"])


@router.get("/{run_id}", response=RunOut, summary="A run as it is now")
def get_run(request: HttpRequest, run_id: str) -> dict[str, Any]:
    run = run_get(run_id, user=request.user)
    if run is None:
        raise Problem("not-found", f"no run {run_id[:100]!r} (or not in this key's tenants)")
    return run_out(request, run)

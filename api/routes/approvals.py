"""Approvals: list the pending ones, decide one (four-eyes and ``expected`` as in the console)."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["approvals"])

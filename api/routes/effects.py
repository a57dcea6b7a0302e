"""Ambiguous effects: list the UNKNOWN ones, resolve one with evidence."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["effects"])

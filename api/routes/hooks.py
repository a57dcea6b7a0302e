"""Signed webhooks in: ``POST /api/v1/hooks/<name>`` turns a verified body into a signal."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["hooks"])

"""``GET /api/v1/problems/<type>``: what a problem ``type`` URI means, for the person reading an
error (no key needed: it holds no data)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema

from api.errors import PROBLEM_BASE, PROBLEM_HELP, PROBLEMS, Problem

router = Router(tags=["problems"])


class ProblemType(Schema):
    type: str
    title: str
    status: int
    description: str


@router.get("/", response=list[ProblemType], auth=None, summary="Every problem type")
def problem_types(request: HttpRequest) -> list[dict]:
    return [_described(kind) for kind in PROBLEMS]


@router.get("/{kind}", response=ProblemType, auth=None, summary="What one problem type means")
def problem_type(request: HttpRequest, kind: str) -> dict:
    if kind not in PROBLEMS:
        raise Problem("not-found", f"no problem type {kind[:100]!r}; GET {PROBLEM_BASE} lists them")
    return _described(kind)


def _described(kind: str) -> dict:
    status, title = PROBLEMS[kind]
    return {"type": f"{PROBLEM_BASE}{kind}", "title": title, "status": status, "description": PROBLEM_HELP[kind]}

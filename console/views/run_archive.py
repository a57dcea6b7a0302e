"""The page of an archived run: read-only, from its archive file (``sagas.retention.store``).

Retention (``sagas.retention.archiving``) deleted the run's rows; ``ArchivedRun`` says when and to which
file, and where in it the run's gzip member is. The page reads that one member and shows
the run as archived: its header, history (journal), effects, approvals and compensation.
Nothing can be done to it. Every value is shown redacted and escaped, as on a live run's page.
A file that cannot be read (moved, unreachable storage) still gives the page, with what the
index knows and why the rest is missing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render

from console.views.base import ConsoleRequest
from core.redaction import redact_text
from operators.selectors.tenancy import scope
from sagas.integration import run_lines, store_for_location
from sagas.models import ArchivedRun

log = logging.getLogger("console.archive")

SECTIONS = ("run", "journal", "effect", "approval", "compensation_plan", "compensation_item")


def archived_get(run_id: Any, *, user: Any) -> ArchivedRun | None:
    """The archive row of ``run_id`` if the user may see its tenant, else None."""
    try:
        return scope(ArchivedRun.objects.filter(run_id=run_id), user).first()
    except (ValueError, TypeError):
        return None


def archived_content(archived: ArchivedRun) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """The run's archived lines by type, and why they could not be read ("" if they could)."""
    sections: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    try:
        store = store_for_location(archived.location)
        lines = run_lines(store, archived.location, archived.offset, archived.length, str(archived.run_id))
    except Exception as exc:  # a missing file, storage away, a damaged member: say so, show the rest
        log.warning("archived run %s: cannot read %s: %s", archived.run_id, archived.location, exc)
        return sections, f"{type(exc).__name__}: {exc}"
    for line in lines:
        sections.setdefault(str(line.get("type")), []).append(line)
    return sections, ""


def run_archived_page(request: ConsoleRequest, archived: ArchivedRun) -> HttpResponse:
    sections, problem = archived_content(archived)
    run = sections["run"][0] if sections["run"] else {}
    error = run.get("error")
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else ""
    return render(request, "console/run_archived.html", {
        "archived": archived, "run": run, "error_message": redact_text(str(message or "")),
        "journal": sections["journal"], "effects": sections["effect"], "approvals": sections["approval"],
        "plan": sections["compensation_plan"][0] if sections["compensation_plan"] else None,
        "items": sections["compensation_item"], "problem": problem,
    })

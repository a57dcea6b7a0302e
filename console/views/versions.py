"""The versions page (live region ``versions_list``) and the source diff between two versions."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.selectors.versions import (
    runs_stranded,
    runs_stranded_count,
    version_get,
    versions_of,
    versions_overview,
)
from console.selectors.versions import (
    version_diff as diff_lines,
)
from console.views.base import ConsoleRequest, bad_request, live_context, viewer_required
from sagas.models import WorkflowVersion

VERSIONS_FRAGMENT = "versions_list"


def _versions_context(user: User, params: dict[str, str]) -> dict[str, Any]:
    return {
        "workflows": versions_overview(user=user),
        "stranded": list(runs_stranded(user=user)),
        "stranded_count": runs_stranded_count(user=user),
    }


def versions_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/versions_live.html", _versions_context(user, params))


@require_GET
@viewer_required
def versions(request: ConsoleRequest) -> HttpResponse:
    context = _versions_context(request.user, {})
    context.update(live_context([VERSIONS_FRAGMENT]))
    return render(request, "console/versions.html", context)


def _version_or_404(value: str | None) -> WorkflowVersion:
    version = version_get(value)
    if version is None:
        raise Http404("no such workflow version")
    return version


@require_GET
@viewer_required
def version_diff(request: ConsoleRequest) -> HttpResponse:
    a = _version_or_404(request.GET.get("a"))
    b = _version_or_404(request.GET.get("b"))
    if a.name != b.name:
        return bad_request(request, f"Only versions of one workflow can be compared: “{a.name}” and “{b.name}” "
                                    f"are two workflows.", title="Not comparable")
    context = {"a": a, "b": b, "lines": diff_lines(a, b), "records": versions_of(a.name)}
    return render(request, "console/versions_diff.html", context)

"""The overview page and its live region (``overview``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.selectors.overview import overview as overview_data
from console.views.base import ConsoleRequest, live_context, viewer_required

OVERVIEW = "overview"

# The chart's geometry, in SVG user units (the SVG scales to the page's width, text with it).
WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 30  # margins: y-axis labels left, time labels below
X_TICK_MINUTES = 10


@dataclass(frozen=True)
class Bar:
    minute: datetime
    started: int
    finished: int
    x_started: str
    x_finished: str
    width: str
    y_started: str
    h_started: str
    y_finished: str
    h_finished: str


@dataclass(frozen=True)
class Tick:
    at: str  # the position along its axis
    label: str


def _nice_ceiling(n: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50 … that is at least ``n``."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= n:
                return step * scale
        scale *= 10


def _f(value: float) -> str:
    return f"{value:.1f}"


def chart(per_minute: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars, axes and tick labels of the runs-per-minute chart (all positions as SVG numbers), and
    its text alternative: ``rows``, the bars of the minutes in which any run started or finished
    (the same numbers, for the table under the chart), and the hour's totals."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    base = TOP + plot_h
    top = _nice_ceiling(max([1, *(m["started"] for m in per_minute), *(m["finished"] for m in per_minute)]))
    slot = plot_w / max(1, len(per_minute))
    bar_w = slot * 0.42

    def height(n: int) -> float:
        return plot_h * n / top

    bars, x_ticks = [], []
    for i, m in enumerate(per_minute):
        x = LEFT + i * slot
        hs, hf = height(m["started"]), height(m["finished"])
        bars.append(Bar(minute=m["minute"], started=m["started"], finished=m["finished"],
                        x_started=_f(x + slot * 0.06), x_finished=_f(x + slot * 0.52), width=_f(bar_w),
                        y_started=_f(base - hs), h_started=_f(hs), y_finished=_f(base - hf), h_finished=_f(hf)))
        if m["minute"].minute % X_TICK_MINUTES == 0:
            x_ticks.append(Tick(at=_f(x), label=f"{m['minute']:%H:%M}"))
    values = [0, top // 2, top] if top % 2 == 0 and top > 1 else [0, top]
    y_ticks = [Tick(at=_f(base - height(v)), label=str(v)) for v in values]
    return {
        "bars": bars, "x_ticks": x_ticks, "y_ticks": y_ticks, "width": WIDTH, "height": HEIGHT,
        "left": LEFT, "right": WIDTH - RIGHT, "top": TOP, "base": base, "label_y": base + 18,
        "label_x": LEFT - 6, "peak": top,
        "rows": [b for b in bars if b.started or b.finished],
        "started_total": sum(b.started for b in bars), "finished_total": sum(b.finished for b in bars),
    }


def _context(user: User) -> dict[str, Any]:
    data = overview_data(user=user)
    return {"overview": data, "chart": chart(data["per_minute"]), "user": user}


@require_GET
@viewer_required
def overview(request: ConsoleRequest) -> HttpResponse:
    context = _context(request.user)
    context.update(live_context([OVERVIEW]))
    return render(request, "console/overview.html", context)


def overview_fragment(user: User, params: dict[str, str]) -> str:
    return render_to_string("console/overview_live.html", _context(user))

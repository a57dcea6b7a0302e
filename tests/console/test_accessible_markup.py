"""What the console looks like to people who do not see colour well or use a screen reader
(WCAG 2.2 AA): the shipped stylesheet's text colours against the surfaces they sit on,
links that stand out without colour, focus that shows, table headers that say what their column
is, and an overview chart whose numbers can be read without hovering or telling colours apart.

The stylesheet is read from the file the console serves (staticfiles' finder), not a copy."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.urls import reverse
from django.utils import timezone

from ledger.models import EffectRecord, EffectStatus
from sagas.models import RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.run_data import parked_run, run_url, text, waiting_run

AA_TEXT = 4.5  # normal text (everything in the console is under 18.66 px bold / 24 px)
AA_NON_TEXT = 3.0  # focus indicators and parts of graphics


# --- reading console.css -----------------------------------------------------------------------

def _stylesheet() -> str:
    path = finders.find("console/console.css")
    assert path, "console/console.css is not among the static files"
    return Path(path).read_text()


def _rules(css: str) -> dict[str, dict[str, str]]:
    """selector -> its declarations (later rules for the same selector win, as in the cascade)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = {name.strip(): value.strip() for name, _, value in (d.partition(":") for d in body.split(";"))
                        if value.strip()}
        for selector in selectors.split(","):
            rules.setdefault(" ".join(selector.split()), {}).update(declarations)
    return rules


RULES = _rules(_stylesheet())
ROOT = RULES[":root"]


def colour(value: str | None) -> str | None:
    """A solid colour as #rrggbb (custom properties resolved), or None (inherit, gradients, none …)."""
    if value is None:
        return None
    value = re.sub(r"var\((--[\w-]+)\)", lambda m: ROOT[m.group(1)], value)
    found = re.fullmatch(r"#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})", value.strip())
    if not found:
        return None
    digits = found.group(1)
    return "#" + ("".join(c * 2 for c in digits) if len(digits) == 3 else digits).lower()


def outline_colour(value: str) -> str | None:
    return next((c for c in (colour(word) for word in value.split()) if c), None)


def luminance(hex_colour: str) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    """The WCAG contrast ratio of two #rrggbb colours (1 to 21)."""
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def over(fg: str, bg: str, opacity: float) -> str:
    """``fg`` drawn at ``opacity`` over ``bg``, as the eye gets it."""
    mixed = (round(opacity * int(fg[i:i + 2], 16) + (1 - opacity) * int(bg[i:i + 2], 16)) for i in (1, 3, 5))
    return "#" + "".join(f"{c:02x}" for c in mixed)


def background(selector: str) -> str:
    found = colour(RULES[selector].get("background") or RULES[selector].get("background-color"))
    assert found, f"{selector} has no solid background in console.css"
    return found


# --- reading rendered pages --------------------------------------------------------------------

class _Headers(HTMLParser):
    """The text of every <th> of a page, with its aria-label if it has one."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "th":
            self._open = [dict(attrs).get("aria-label") or ""]

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "th" and self._open is not None:
            self.headers.append(" ".join("".join(self._open).split()))
            self._open = None


def table_headers(html: str) -> list[str]:
    parser = _Headers()
    parser.feed(html)
    return parser.headers


# --- colours -----------------------------------------------------------------------------------

def test_it_gives_every_coloured_box_text_that_passes_aa_on_it():
    """Badges, notices, error boxes, buttons: every rule that sets both a text colour and a solid
    background keeps them 4.5:1 apart (disabled buttons too, though WCAG exempts them)."""
    pairs = {selector: (colour(d.get("color")), colour(d.get("background") or d.get("background-color")))
             for selector, d in RULES.items()}
    pairs = {selector: (fg, bg) for selector, (fg, bg) in pairs.items() if fg and bg}
    # The badges and boxes the audit found too faint are among them.
    for selector in (".badge.COMPLETED", ".badge.NEEDS_ATTENTION", ".badge.FAILED", ".badge.RUNNING",
                     ".action-message.success", ".action-message.warning", ".flash.error", "button.danger",
                     "button:disabled", ".run-error"):
        assert selector in pairs, selector
    faint = {selector: round(contrast(fg, bg), 2) for selector, (fg, bg) in pairs.items()
             if contrast(fg, bg) < AA_TEXT}
    assert faint == {}


def test_it_keeps_every_text_colour_readable_on_every_light_surface():
    """Muted text, links, the status colours (``.yes``, ``.run-reason``, overdue countdowns …)
    land on the panel, the page, table heads, attention rows, a targeted history entry and a row
    that left its list: each of them on each of those is 4.5:1 or more."""
    texts = {name: colour(ROOT[name]) for name in ("--ink", "--muted", "--accent", "--ok", "--warn", "--bad",
                                                   "--wait", "--info")}
    texts[".yes"] = colour(RULES[".yes"]["color"])
    texts[".run-reason"] = colour(RULES[".run-reason"]["color"])
    surfaces = {"--panel": colour(ROOT["--panel"]), "--bg": colour(ROOT["--bg"])}
    for selector in ("table.grid th", "tr.attention td", "tr.approval.escalated td", ".run-hint",
                     "ol.timeline > li.entry:target", ".live-gone > td", ".badge"):
        surfaces[selector] = background(selector)
    faint = {(t, s): round(contrast(fg, bg), 2) for t, fg in texts.items() for s, bg in surfaces.items()
             if contrast(fg, bg) < AA_TEXT}
    assert faint == {}
    assert contrast(texts["--muted"], surfaces["--panel"]) >= 5.5  # greys with margin, not at the edge


def test_it_keeps_the_header_and_its_live_status_readable():
    header_bg, header_fg = background("header.top"), colour(RULES["header.top"]["color"])
    nav = over(header_fg, header_bg, float(RULES["header.top nav a"]["opacity"]))
    assert contrast(nav, header_bg) >= AA_TEXT
    states = [s for s in RULES if s.startswith('.live-status[data-state="')]
    assert len(states) >= 3  # open, closed, paused
    for selector in (".live-status", *states):
        assert contrast(header_fg, background(selector)) >= AA_TEXT, selector


def test_it_shows_keyboard_focus_everywhere_and_never_hides_it():
    focus = RULES[":focus-visible"]
    assert focus["outline"].split()[0] not in ("0", "none")
    ring = outline_colour(focus["outline"])
    for surface in (colour(ROOT["--panel"]), colour(ROOT["--bg"])):
        assert contrast(ring, surface) >= AA_NON_TEXT
    dark_ring = colour(RULES["header.top :focus-visible"]["outline-color"])
    assert contrast(dark_ring, background("header.top")) >= AA_NON_TEXT
    hidden = [s for s, d in RULES.items() if re.fullmatch(r"(none|0)(\s.*)?", d.get("outline", "x"))]
    assert hidden == []


def test_it_underlines_links_so_colour_is_not_what_tells_them_from_text():
    assert RULES["a"]["text-decoration"].startswith("underline")
    not_underlined = {s for s, d in RULES.items() if d.get("text-decoration") == "none"}
    # Only links that are clearly not inside text: the header's navigation, status cards, buttons.
    assert not_underlined <= {"header.top a", "a.card", "a.button", "a.button:hover"}, not_underlined


# --- table headers -----------------------------------------------------------------------------

def test_it_has_no_template_with_an_empty_table_header():
    templates = [p for d in settings.TEMPLATES for base in d["DIRS"] for p in Path(base).rglob("*.html")]
    assert len(templates) > 30
    empty = [str(p) for p in templates if re.search(r"<th\b[^>]*>\s*</th>", p.read_text())]
    assert empty == []


@pytest.mark.django_db
def test_it_names_every_column_of_a_run_page_and_the_queues(people):
    waiting = waiting_run("acc-1")
    parked = parked_run()
    stuck = WorkflowRun.objects.create(workflow_name="acc", version=1, definition_hash="0" * 64,
                                       status=RunStatus.NEEDS_ATTENTION, status_reason="effect_unknown")
    EffectRecord.objects.create(tenant="default", idempotency_key=f"acc-{uuid.uuid4()}", run_id=stuck.id,
                                step_name="capture", connector="acc.pay", request_payload={}, payload_hash="0" * 64,
                                status=EffectStatus.UNKNOWN, intent_at=timezone.now(), attempts=1)
    pages = {
        "operator": [run_url(waiting), run_url(parked), reverse("console:runs"), reverse("console:effects")],
        "approver": [run_url(waiting), reverse("console:approvals")],
        "viewer": [reverse("console:overview")],
    }
    seen = []
    for role, urls in pages.items():
        client = client_for(people[role])
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
            headers = table_headers(text(response))
            assert headers, url
            assert "" not in headers, (role, url, headers)
            seen += headers
    # The two columns that had no header: the budget's meter and the approvals' actions.
    assert "Share of the limit used" in seen and "Actions" in seen


# --- the overview chart ------------------------------------------------------------------------

@pytest.mark.django_db
def test_it_puts_the_charts_numbers_in_a_table_and_tells_the_series_apart_without_colour(people):
    now = timezone.now().replace(second=30, microsecond=0)
    t20, t5, t2 = now - timedelta(minutes=20), now - timedelta(minutes=5), now - timedelta(minutes=2)
    made = [WorkflowRun.objects.create(workflow_name="acc", version=1, definition_hash="0" * 64,
                                       status=RunStatus.RUNNING) for _ in range(4)]
    for run, created, finished in zip(made, (t5, t5, t5, t20), (t5, t5, None, t2)):
        WorkflowRun.objects.filter(id=run.id).update(created_at=created, finished_at=finished)

    html = text(client_for(people["viewer"]).get(reverse("console:overview")))

    bars = {m: (int(s), int(f)) for m, s, f in
            re.findall(r"<title>(\d\d:\d\d) · started (\d+) · finished (\d+)</title>", html)}
    assert len(bars) == 60
    numbers = html[html.index('<details class="chart-numbers">'):]
    numbers = numbers[:numbers.index("</details>")]
    assert "<summary>Runs per minute as a table</summary>" in numbers
    rows = {m: (int(s), int(f)) for m, s, f in
            re.findall(r'<tr><th scope="row">(\d\d:\d\d)</th><td class="num">(\d+)</td><td class="num">(\d+)</td></tr>',
                       numbers)}
    # The table says what the bars say: every minute with a run, none without.
    assert rows == {m: n for m, n in bars.items() if n != (0, 0)}
    assert rows == {f"{t5:%H:%M}": (3, 2), f"{t20:%H:%M}": (1, 0), f"{t2:%H:%M}": (0, 1)}
    total = re.search(r'<tfoot><tr><th scope="row">Last hour</th><td class="num">(\d+)</td>'
                      r'<td class="num">(\d+)</td></tr></tfoot>', numbers)
    assert total and total.groups() == ("4", "3")

    # Started bars are hatched (a pattern the page defines), finished bars are solid; the legend says so.
    chart = html[html.index('<svg class="chart"'):html.index("</svg>", html.index('<svg class="chart"'))]
    assert '<pattern id="chart-hatch"' in chart
    started = re.findall(r'<rect class="started"([^>]*)>', chart)
    finished = re.findall(r'<rect class="finished"([^>]*)>', chart)
    assert len(started) == len(finished) == 60
    assert all('fill="url(#chart-hatch)"' in r for r in started) and not any("url(" in r for r in finished)
    legend = re.sub(r"<[^>]+>", "", re.search(r'<p class="legend">(.*?)</p>', html, re.S).group(1))
    assert "started (hatched" in legend and "finished (solid" in legend
    # The hatching and the bars' outline are visible against the panel (non-text contrast).
    outline = colour(RULES["rect.started"]["stroke"])
    assert contrast(outline, colour(ROOT["--panel"])) >= AA_NON_TEXT
    assert contrast(colour(RULES["rect.finished"]["fill"]), colour(ROOT["--panel"])) >= AA_NON_TEXT
    region = html[html.index('<div id="live-overview">'):]
    assert "style=" not in region and "<style" not in region  # the Content-Security-Policy allows no inline style


@pytest.mark.django_db
def test_it_says_so_when_no_run_moved_in_the_last_hour(people):
    html = text(client_for(people["viewer"]).get(reverse("console:overview")))
    numbers = html[html.index('<details class="chart-numbers">'):]
    assert "No run started or finished in the last hour." in numbers[:numbers.index("</details>")]
    assert "<table" not in numbers[:numbers.index("</details>")]


@pytest.mark.django_db
def test_no_page_prints_a_template_comment_as_text(people):
    """Django's ``{# #}`` is one line only: a comment spread over two lines is printed into the
    page (base.html did that above every page's notices). Checked on the rendered pages of each
    role and on the template files themselves."""
    for person in ("viewer", "operator"):
        client = client_for(people[person])
        for name in ("console:overview", "console:runs", "console:approvals", "console:audit"):
            html = text(client.get(reverse(name)))
            assert "{#" not in html and "#}" not in html, (person, name)
    root = Path(settings.BASE_DIR) / "templates"
    for template in root.rglob("*.html"):
        for number, line in enumerate(template.read_text().splitlines(), 1):
            assert line.count("{#") == line.count("#}"), f"{template.relative_to(root)}:{number}: {line.strip()}"

"""axe-core in the console's pages, for tests/browser/test_accessibility.py.

``Sweep`` logs a role in, visits pages, waits until each has settled (loaded, its live socket
open or known to be off) and runs axe-core's WCAG 2.0/2.1/2.2 A and AA rules on it, with every
``<details>`` opened so what they hide is checked too. It keeps every violation; the test fails
on those of impact serious or critical (``Sweep.failing``) and prints the rest.

axe-core is vendored for the tests only (``tests/browser/vendor/``): it is never served to users.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.browser.conftest import _no_dialog
from tests.procs import ROOT

AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
AXE_VERSION = "4.14.1"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
FAILING = frozenset({"serious", "critical"})
REPORT = ROOT / "test-artifacts" / "axe-report.json"

# Loaded, and the live socket either open or off (a page with no live region, or no user).
SETTLED = """() => {
  if (document.readyState !== "complete") return false;
  const status = document.getElementById("live-status");
  return !status || !document.querySelector("[ws-connect]") ? true : status.dataset.state === "open";
}"""
# In one call (each is a round trip to the browser, 100 checks): every <details> opened, then
# axe-core's rules; null when axe-core is not in the page.
RUN_AXE = """async (tags) => {
  document.querySelectorAll("details:not([open])").forEach((d) => { d.open = true; });
  if (typeof window.axe !== "object") return null;
  const result = await axe.run(document, {runOnly: {type: "tag", values: tags}, resultTypes: ["violations"]});
  return result.violations.map((v) => ({
    rule: v.id, impact: v.impact || "", help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(" "), html: n.html, summary: n.failureSummary || ""})),
  }));
}"""


@dataclass(frozen=True)
class Violation:
    rule: str
    impact: str
    help: str
    page: str
    path: str
    role: str
    nodes: int
    target: str
    html: str
    summary: str

    def line(self) -> str:
        html = " ".join(self.html.split())
        return (f"{self.rule} ({self.impact}) on {self.page} [{self.path}] as {self.role}: {self.nodes} node(s), "
                f"first {self.target} {html[:200]}")


class Sweep:
    """One browser context per role (the console fixture's browser); ``check`` runs axe on the
    page as it is now."""

    def __init__(self, console) -> None:
        self.console = console
        self.violations: list[Violation] = []
        self.checked: list[str] = []
        self.seconds: list[tuple[float, float, str]] = []  # (settling, axe) per check, for the summary
        self.loading = 0.0  # seconds in page.goto, for the summary

    def page(self, username: str | None) -> Page:
        """A page of a new context of the console fixture, logged in as ``username`` (None: nobody).

        axe-core goes into every document of the context as an init script. Not with
        ``add_script_tag``: that inserts an inline <script>, which the console's policy
        (script-src 'self') blocks, and bypassing the policy would check pages other than the
        ones users get. An init script is evaluated through the DevTools protocol, which the
        policy does not govern (as tests/browser/test_csp.py's recorder), before the page's own
        scripts; it only defines ``window.axe``."""
        context = self.console.context(username, init_path=AXE)  # logged in by its session cookie
        page = context.new_page()
        page.on("dialog", _no_dialog)
        return page

    def visit(self, page: Page, label: str, path: str, role: str, *, status: int = 200) -> None:
        started = time.monotonic()
        response = page.goto(path)
        self.loading += time.monotonic() - started
        assert response is not None and response.status == status, f"{label} {path} as {role}: " \
            f"{response and response.status}, expected {status}"
        self.check(page, label, role)

    def check(self, page: Page, label: str, role: str) -> None:
        """axe on the page as it is now, every <details> open."""
        started = time.monotonic()
        page.wait_for_function(SETTLED, timeout=10_000)
        settled = time.monotonic()
        found = page.evaluate(RUN_AXE, TAGS)
        assert found is not None, f"no axe-core in {page.url}"
        path = page.url.removeprefix(self.console.base)
        self.seconds.append((settled - started, time.monotonic() - settled, f"{label} as {role}"))
        self.checked.append(f"{label} [{path}] as {role}")
        for v in found:
            first = v["nodes"][0] if v["nodes"] else {"target": "", "html": "", "summary": ""}
            self.violations.append(Violation(v["rule"], v["impact"], v["help"], label, path, role, len(v["nodes"]),
                                             first["target"], first["html"], first["summary"]))

    def failing(self) -> list[Violation]:
        return [v for v in self.violations if v.impact in FAILING]

    def timings(self) -> str:
        """Where the time went: settling (load, live socket) and axe itself."""
        if not self.seconds:
            return "no page checked"
        slowest = sorted(self.seconds, key=lambda t: -(t[0] + t[1]))[:5]
        settling, axe = sum(t[0] for t in self.seconds), sum(t[1] for t in self.seconds)
        return (f"{len(self.seconds)} checks: loading pages {self.loading:.1f} s, settling {settling:.1f} s, "
                f"axe {axe:.1f} s; slowest: "
                + "; ".join(f"{name} {a:.1f}+{b:.1f} s" for a, b, name in slowest))

    def report(self) -> str:
        """Every violation, serious and critical first, also written to test-artifacts/axe-report.json."""
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps({"axe": AXE_VERSION, "tags": TAGS, "checked": self.checked,
                                      "violations": [asdict(v) for v in self.violations]}, indent=1))
        ordered = sorted(self.violations, key=lambda v: (v.impact not in FAILING, v.rule, v.page, v.role))
        return "\n".join(v.line() for v in ordered)


def wait_live(page: Page) -> None:
    expect(page.locator("#live-status")).to_have_attribute("data-state", "open", timeout=10_000)

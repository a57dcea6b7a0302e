"""The Content-Security-Policy in a real browser: every console page and the Django admin load with
no violation and no script error, an action refused by the server still shows its reason (that
swap used an inline hx-on handler, which needs eval), and live updates still arrive over the
websocket (connect-src 'self')."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.urls import reverse
from playwright.sync_api import expect

from operators.models import AuditEntry
from sagas import services, start
from sagas.models import RunStatus, WorkflowRun
from tests.browser.conftest import PASSWORD
from tests.ledger import wf_sagas  # noqa: F401  (registers capture_then_wait here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Runs in every document before the page's own scripts (through the DevTools protocol, which the
# policy does not govern), so a violation during load is caught too.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(
  `${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile || 'the page'}:${e.lineNumber})`));
"""
CONSOLE_PAGES = ["/", "/runs/", "/runs/{run}/", "/effects/", "/approvals/", "/audit/", "/versions/"]


class Watched:
    """A browser page that keeps every CSP violation, console error and uncaught exception."""

    def __init__(self, console) -> None:
        context = console.browser.new_context(base_url=console.base)
        context.add_init_script(RECORD_VIOLATIONS)
        self.page = context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and not m.text.startswith("Failed to load resource")
                     and self.problems.append(f"{self.page.url}: {m.text}"))
        self.page.on("response", lambda r: r.status >= 400 and not r.url.endswith("/favicon.ico")
                     and self.problems.append(f"{self.page.url}: {r.status} from {r.url}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"{self.page.url}: uncaught {e}"))

    def visit(self, path: str, *, live: bool = False) -> dict[str, str]:
        response = self.page.goto(path)
        assert response is not None and response.status == 200, f"{path}: {response and response.status}"
        if live:  # the websocket opened under connect-src 'self'
            expect(self.page.locator("#live-status")).to_have_text("live", timeout=10_000)
        self.check()
        return response.headers

    def log_in(self, login_path: str, username: str) -> None:
        self.visit(login_path)
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", PASSWORD)
        with self.page.expect_navigation():
            self.page.click("[type=submit]")
        self.check()

    def check(self) -> None:
        # Violation events are queued as tasks: once the page's event loop is idle, they have run.
        self.page.evaluate("() => new Promise((done) => requestIdleCallback(() => done(), {timeout: 2000}))")
        self.problems += [f"{self.page.url}: {v}" for v in self.page.evaluate("window.__violations || []")]
        self.page.evaluate("window.__violations = []")


def test_it_serves_every_console_page_under_a_strict_policy_without_a_violation(console, users):
    run = start("capture_then_wait", {"id": "csp-1"}, started_by=users["sam"])
    console.worker("w1")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.WAITING, 30, what="the run to wait")

    olga = Watched(console)
    olga.log_in("/login/", "olga")
    headers = olga.visit("/", live=True)
    policy = headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
                      "object-src 'none'", "base-uri 'none'", "form-action 'self'", "frame-ancestors 'none'"):
        assert directive in policy, policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    for path in CONSOLE_PAGES[1:]:
        olga.visit(path.format(run=run.id), live=True)
    console.shot(olga.page, "csp-versions")

    # A refusal (409: the page's state is stale) is still swapped into the page with its reason.
    olga.visit(f"/runs/{run.id}/", live=True)
    actions = olga.page.locator("#live-run_actions")
    actions.locator("summary", has_text="Cancel").click()
    cancel = actions.locator("form[action$='/cancel/']")
    # The stale state is set and the form sent in one script: a live push that re-renders the
    # actions between two steps of the test would put the true state back (as it should).
    cancel.evaluate("""form => {
        form.querySelector("input[name=expected]").value = "RUNNING";
        form.querySelector("textarea[name=reason]").value = "customer asked";
        form.querySelector("button[type=submit]").click();
    }""")
    expect(olga.page.locator("#messages .action-message.error")).to_be_visible(timeout=10_000)
    assert AuditEntry.objects.filter(action="run.cancel", outcome="refused").count() == 1
    olga.problems = [p for p in olga.problems if "409 from" not in p]  # the refusal itself

    # A change made elsewhere reaches the open page over the websocket.
    services.run_cancel(run_id=str(run.id), user=users["sam"], reason="from elsewhere", compensate=False)
    expect(olga.page.locator("#live-run_header")).to_contain_text("CANCELLED", timeout=15_000)
    olga.check()
    console.shot(olga.page, "csp-run-cancelled-live")

    assert olga.problems == []


def test_it_keeps_the_django_admin_working_under_the_policy(console, users):
    root = get_user_model().objects.create(username="root", password=make_password(PASSWORD), is_staff=True,
                                           is_superuser=True)
    run = start("capture_then_wait", {"id": "csp-2"}, started_by=users["sam"])

    admin = Watched(console)
    admin.log_in(reverse("admin:login"), "root")
    expect(admin.page.locator("#site-name")).to_be_visible()
    for path in (reverse("admin:index"), reverse("admin:auth_user_changelist"),
                 reverse("admin:auth_user_change", args=[root.pk]), reverse("admin:sagas_workflowrun_changelist"),
                 reverse("admin:sagas_workflowrun_change", args=[run.id])):
        admin.visit(path)
    # The admin's own scripts ran: the "select all" checkbox of a change list selects the rows.
    admin.visit(reverse("admin:auth_user_changelist"))
    admin.page.check("#action-toggle")
    expect(admin.page.locator("input.action-select").first).to_be_checked()
    console.shot(admin.page, "csp-admin-changelist")

    assert admin.problems == []

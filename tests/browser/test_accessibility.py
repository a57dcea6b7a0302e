"""Issue 17: the console meets WCAG 2.2 AA as far as a machine can tell, in a real browser.

axe-core (tests/browser/a11y.py, vendored in tests/browser/vendor/) checks every console page each
role can see (an approver's only where it differs from a viewer's: the approval controls; the
variants of a page, such as the runs list's other filters, as an operator), in
the states that matter, built with real runs: a run needing attention (an
UNKNOWN effect), a run waiting for an approval, a compensated run, a completed run with a hostile
payload, a run cancelled by a bulk batch, an archived run, a run with child runs and a detached child, a paused connector and one whose
limits were changed, spend limits (one reached, for a hostile tenant), a form refused with its error (login, compensation, a stale cancel, a
notification endpoint), the audit log with entries, error pages;
every <details> open; and again after a live push replaced a section. Any serious or critical
violation fails the test, with its rule, page, role and first node.

The keyboard-only test is in test_keyboard_only.py.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import Page, expect

from api.keys import apikey_create, apikey_revoke
from console.models import BulkBatch, BulkState
from console.services.bulk import batch_confirm, batch_preview
from demo.providers.faults import inject
from ledger.flow import spend
from ledger.flow.services import Limits
from ledger.models import ConnectorFlow, EffectRecord, SpendDay
from operators import roles
from operators.models import AuditEntry
from operators.services.actions import Actor
from operators.services.connectors import connector_limits_act, connector_pause_act, connector_spend_limit_act
from operators.services.queues import approval_act, effect_manual_resolve
from operators.services.runs import run_compensate_act
from sagas import backfill_schedule, create_schedule, pause_schedule, schedule, start
from sagas.models import ApprovalRequest, ApprovalState, ArchivedRun, RunStatus, WorkflowRun, WorkflowVersion
from sagas.replay.engine import advance
from sagas.retention.archiving import archive_due
from sagas.testing import frozen_clock
from tests.browser.a11y import Sweep, wait_live
from tests.browser.conftest import _password_hash
from tests.ledger import wf_orders, wf_sagas  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until
from tests.sagas import wf_children, wf_retention  # noqa: F401  (register waiting_tree, and ret_order archived below)

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "<script>alert('a11y')</script><img src=x onerror=alert(1)>"
# An approver sees what a viewer sees (every page is swept as a viewer), plus the approval
# controls on these: swept as an approver too. The operator and staff, who see the most, sweep all.
APPROVER_PAGES = frozenset({"overview", "approvals", "run waiting for an approval"})
STAFF_PAGES = frozenset({"overview", "API keys", "notification endpoints"})
# Variants of a page already checked for every role (the runs list with other filters, a run page
# of another shape), which a role changes no more than it changes that page (its action controls):
# checked as an operator, who sees the most controls. The suite runs on two cores for ten minutes.
OPERATOR_ONLY_VARIANTS = frozenset({"runs needing attention", "runs, children of one run", "runs, top-level only",
                                    "runs, a bad parent filter (400)", "detached child run", "version diff"})


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def short(run) -> str:
    return str(run.id)[:8]


def _staff(users) -> None:
    """A staff operator (API keys, notification endpoints), beside the fixture's users."""
    user = get_user_model().objects.create(username="stella", password=_password_hash(), is_staff=True)
    user.groups.add(Group.objects.get(name=roles.OPERATOR))
    users["stella"] = user


class States:
    """Runs and objects in the states the pages must be accessible in: started here, in those
    states once ``ready`` returns."""

    def __init__(self, console, users) -> None:
        # An archived run first, before any worker (its workflow is registered only here).
        old = start("ret_order", {"id": "a11y-old", "note": HOSTILE}, business_key="order-a11y-old")
        advance(str(old.id), owner="t")
        WorkflowRun.objects.filter(id=old.id).update(finished_at=timezone.now() - timedelta(days=45))
        assert archive_due().runs == 1
        self.archived = ArchivedRun.objects.get(run_id=old.id)

        inject("email", "send", "timeout_after_work")
        self.attention = start("email_only", {"id": "a11y-unknown"}, business_key="order-a11y-unknown")
        self.waiting = start("approve_then_ship", {"id": "a11y-wait"}, business_key="order-a11y-wait",
                             started_by=users["sam"])
        self.hostile = start("capture_only", {"id": HOSTILE, "card_number": "4111111111111111"},
                             business_key="order-a11y-hostile")
        self.undone = start("capture_then_wait", {"id": "a11y-undo"}, business_key="order-a11y-undo")
        self.cancelled = start("capture_then_wait", {"id": "a11y-bulk"}, business_key="order-a11y-bulk")
        # A run's tree (sagas.children): a parent waiting for its children, one of them detached.
        self.tree = start("waiting_tree", {"n": 2, "detached": True}, business_key="order-a11y-tree")
        console.worker("w1")
        console.procs.worker("w-tree", "tests.sagas.wf_children", DEMO_PROVIDERS_URL=console.providers_url)

    def ready(self, users) -> States:
        """Once the worker brought the runs to their states: the operators' work on them."""
        olga = Actor(user=users["olga"], ip=None)
        wait_until(lambda: (status(self.attention), status(self.waiting), status(self.hostile), status(self.undone),
                            status(self.cancelled)) == (RunStatus.NEEDS_ATTENTION, RunStatus.WAITING,
                                                        RunStatus.COMPLETED, RunStatus.WAITING, RunStatus.WAITING),
                   60, what="the runs to reach their states")
        wait_until(lambda: status(self.tree) == RunStatus.WAITING and WorkflowRun.objects.filter(
            parent_run=self.tree.id, status=RunStatus.WAITING).count() == 3, 60, what="the tree to wait")
        self.tree_child = WorkflowRun.objects.filter(parent_run=self.tree.id, detached=True).get()
        self.effect = EffectRecord.objects.get(run_id=self.attention.id)
        self.approval = ApprovalRequest.objects.get(run=self.waiting)

        # Operators' work, through the services the pages call (so the audit log has entries).
        run_compensate_act(olga, run_id=str(self.undone.id), reason="customer cancelled by phone", expected="WAITING")
        batch = batch_preview(olga, action="run.cancel", ids=[str(self.cancelled.id)], filters={})
        self.batch = batch_confirm(olga, token=batch.token, reason="duplicate order, ticket OPS-7", confirmed=True)
        self.draft = batch_preview(olga, action="effect.resolve", ids=[str(self.effect.id)], filters={})
        key, _ = apikey_create(name="orders-sync", role="operator", tenants=["default"])
        apikey_create(name="old-batch", role="viewer", expires_at=timezone.now() - timedelta(days=1))
        gone, _ = apikey_create(name="leaked", role="approver")
        apikey_revoke(key=gone, by="stella")
        wait_until(lambda: status(self.undone) == RunStatus.COMPENSATED
                   and BulkBatch.objects.get(token=self.batch.token).state == BulkState.DONE
                   and status(self.cancelled) == RunStatus.CANCELLED, 60,
                   what="the compensation and the bulk cancel to finish")
        # A schedule fired twice (a run, and a refused start), paused with a hostile reason.
        with frozen_clock(datetime(2030, 4, 1, 12, tzinfo=UTC)):
            create_schedule("email_only", schedule("nightly-a11y", cron="30 2 * * *", timezone="Europe/Berlin",
                                                   input={"id": HOSTILE}, overlap="allow_all"))
        backfill_schedule("nightly-a11y", start=datetime(2030, 3, 30, tzinfo=UTC),
                          end=datetime(2030, 3, 30, 23, tzinfo=UTC), user=users["olga"])
        pause_schedule("nightly-a11y", reason=HOSTILE, user=users["olga"])
        # The connectors page with a paused connector (Resume, a hostile reason) and changed limits
        # (Back to the declared defaults); connectors no run here uses.
        connector_pause_act(olga, name="model.complete", reason=HOSTILE, expected="running")
        ship = ConnectorFlow.objects.get(connector="rp.ship")
        connector_limits_act(olga, name="rp.ship", limits=Limits(**{**Limits.of(ship).as_dict(), "rate": 5.0}),
                             reason="provider asked us to slow down", expected="running")
        # Its spend limits: the every-tenant one, and a hostile tenant's, reached today.
        connector_spend_limit_act(olga, tenant="*", connector="model", per_day=Decimal("5"), reason="monthly budget",
                                  expected="none")
        connector_spend_limit_act(olga, tenant=HOSTILE, connector="model", per_day=Decimal("1"), reason=HOSTILE,
                                  expected="none")
        SpendDay.objects.create(tenant=HOSTILE, connector="model", day=spend.today(), spent=Decimal("1.25"))
        self.version = WorkflowVersion.objects.filter(name="approve_then_ship").values_list("id", flat=True).first()
        assert self.version is not None
        assert AuditEntry.objects.filter(action="run.compensate", outcome="ok").exists()
        return self

    def pages(self, role: str) -> list[tuple[str, str, int]]:
        """(label, path, status) of every page ``role`` can see."""
        pages = [
            ("overview", "/", 200),
            ("runs", "/runs/", 200),
            ("runs needing attention", "/runs/?status=NEEDS_ATTENTION", 200),
            ("run needing attention (UNKNOWN effect)", f"/runs/{self.attention.id}/", 200),
            ("run waiting for an approval", f"/runs/{self.waiting.id}/", 200),
            ("compensated run", f"/runs/{self.undone.id}/", 200),
            ("completed run with a hostile payload", f"/runs/{self.hostile.id}/", 200),
            ("run cancelled by a bulk batch", f"/runs/{self.cancelled.id}/", 200),
            ("archived run", f"/runs/{self.archived.run_id}/", 200),
            ("run with child runs", f"/runs/{self.tree.id}/", 200),
            ("detached child run", f"/runs/{self.tree_child.id}/", 200),
            ("runs, children of one run", f"/runs/?parent={self.tree.id}", 200),
            ("runs, top-level only", "/runs/?top_level=1", 200),
            ("runs, a bad parent filter (400)", "/runs/?parent=not-a-run", 400),
            ("run history", f"/runs/{self.hostile.id}/history/", 200),
            ("compensation preview", f"/runs/{self.waiting.id}/compensate/", 200),
            ("ambiguous effects", "/effects/", 200),
            ("approvals", "/approvals/", 200),
            ("versions", "/versions/", 200),
            ("version diff", f"/versions/diff/?a={self.version}&b={self.version}", 200),
            ("workers", "/workers/", 200),
            ("connectors", "/connectors/", 200),
            ("audit log", "/audit/", 200),
            ("bulk batches", "/bulk/", 200),
            ("bulk batch progress", f"/bulk/{self.batch.token}/", 200),
            ("notifications", "/notifications/", 200),
            ("schedules", "/schedules/", 200),
            ("paused schedule with its ticks and a backfill preview",
             "/schedules/nightly-a11y/?start=2030-03-30T00:00&end=2030-04-01T23:00", 200),
            ("unknown run (404)", f"/runs/{uuid.uuid4()}/", 404),
        ]
        if role == "staff":
            pages += [("API keys", "/api-keys/", 200), ("notification endpoints", "/notifications/endpoints/", 200)]
        else:
            pages += [("API keys, refused (403)", "/api-keys/", 403)]
        if role == "operator":
            pages += [("bulk preview (a draft batch)", f"/bulk/{self.draft.token}/", 200)]
        if role == "approver":  # a viewer's pages, and the approval controls on these three
            pages = [page for page in pages if page[0] in APPROVER_PAGES]
        elif role == "staff":  # an operator's pages (checked as the operator) plus its own: the nav's
            pages = [page for page in pages if page[0] in STAFF_PAGES]  # staff links, and the staff pages
        elif role != "operator":
            pages = [page for page in pages if page[0] not in OPERATOR_ONLY_VARIANTS]
        return pages


def _form_errors(sweep: Sweep, page: Page, states: States, role: str) -> None:
    """An operator's forms answered with their error."""
    # A compensation without a reason (the browser's own check taken away, as an old browser would
    # send it): the preview again, 400, with the error.
    page.goto(f"/runs/{states.waiting.id}/compensate/")
    page.locator("textarea[name=reason]").evaluate("t => t.removeAttribute('required')")
    with page.expect_navigation():
        page.get_by_role("button", name=re.compile("Start the compensation")).click()
    expect(page.get_by_role("alert")).to_be_visible()
    sweep.check(page, "compensation refused: no reason", role)
    # A cancel from a page that is out of date: refused (409), the reason as a message.
    page.goto(f"/runs/{states.waiting.id}/")
    wait_live(page)
    actions = page.locator("#live-run_actions")
    actions.locator("summary", has_text="Cancel").click()
    # In one go, so that no push in between puts the page's state back into the form.
    actions.locator("form[action$='/cancel/']").evaluate("""form => {
        form.querySelector("[name=expected]").value = "RUNNING";
        form.querySelector("[name=reason]").value = "customer asked";
        form.requestSubmit(); }""")
    expect(page.locator("#messages .action-message.error")).to_be_visible(timeout=10_000)
    sweep.check(page, "run page with a refused cancel", role)
    assert status(states.waiting) == RunStatus.WAITING


def _staff_forms(sweep: Sweep, page: Page, role: str) -> None:
    """A notification endpoint: refused with its error, then added (its page shows the secret)."""
    page.goto("/notifications/endpoints/")
    page.locator("input[name=name]").fill("ops hook")
    page.locator("input[name=url]").fill("ftp://hooks.example.com/saga")
    page.locator("input[name=active]").uncheck()
    with page.expect_navigation():
        page.get_by_role("button", name="Add endpoint").click()
    expect(page.locator("main")).to_contain_text("must start with http")
    sweep.check(page, "notification endpoint refused: bad URL", role)
    page.locator("input[name=url]").fill("https://hooks.example.com/saga")
    with page.expect_navigation():
        page.get_by_role("button", name="Add endpoint").click()
    expect(page).to_have_url(re.compile(r"/notifications/endpoints/\d+/$"))
    sweep.check(page, "notification endpoint", role)


def _anonymous(sweep: Sweep) -> None:
    """Nobody logged in: the login page, and its error (needs no run: checked while the worker
    brings the runs to their states)."""
    page = sweep.page(None)
    sweep.visit(page, "login", "/login/", "anonymous")
    page.fill("input[name=username]", "nobody-here")
    page.fill("input[name=password]", "wrong-password-1")
    with page.expect_navigation():
        page.click("button[type=submit]")
    expect(page.locator("main")).to_contain_text("Wrong username or password")
    sweep.check(page, "login refused", "anonymous")
    for _ in range(5):  # after five failures that name is locked out from this address (django-axes)
        if page.locator("input[name=password]").count() == 0:
            break
        page.fill("input[name=username]", "nobody-here")
        page.fill("input[name=password]", "wrong-password-1")
        with page.expect_navigation():
            page.click("button[type=submit]")
    expect(page.locator("h1")).to_be_visible()
    assert "locked" in page.locator("main").inner_text().lower(), page.locator("main").inner_text()
    sweep.check(page, "login locked out", "anonymous")
    page.context.close()


def _sweep(sweep: Sweep, states: States, users) -> None:
    for role, username in (("viewer", "vic"), ("approver", "ann"), ("operator", "olga"), ("staff", "stella")):
        page = sweep.page(username)
        for label, path, code in states.pages(role):
            sweep.visit(page, label, path, role, status=code)
        if role == "operator":
            _form_errors(sweep, page, states, role)
        if role == "staff":
            _staff_forms(sweep, page, role)
        if role == "operator":
            operator = page  # kept for the pushes below
        else:
            page.context.close()
    page = operator

    # After live pushes replaced a section: the queue without the effect someone resolved, the
    # run page of a run someone approved (it goes on and completes).
    page.goto("/effects/")
    wait_live(page)
    effect_manual_resolve(Actor(user=users["sam"], ip=None), effect_id=states.effect.id, outcome="succeeded",
                          downstream_ref="msg-4711", note="found in the mail server log", expected="UNKNOWN")
    expect(page.locator(f"#effect-{states.effect.id}")).to_have_count(0, timeout=10_000)
    sweep.check(page, "ambiguous effects after a push", "operator")
    page.goto(f"/runs/{states.waiting.id}/")
    wait_live(page)
    approval_act(Actor(user=users["ann"], ip=None), approval_id=states.approval.id, approve=True,
                 comment="address verified", expected=ApprovalState.PENDING)
    expect(page.locator("#live-run_header")).to_contain_text("COMPLETED", timeout=20_000)
    sweep.check(page, "run page after pushes (approved, completed)", "operator")
    page.goto("/")
    wait_live(page)
    sweep.check(page, "overview after the changes", "operator")
    page.context.close()


def test_it_finds_no_serious_or_critical_axe_violation_on_any_page_for_any_role(console, users, tmp_path, settings):
    settings.SAGAS_ARCHIVE_URL = (tmp_path / "archive").as_uri()
    _staff(users)
    states = States(console, users)
    sweep = Sweep(console)
    try:
        _anonymous(sweep)
        _sweep(sweep, states.ready(users), users)
    finally:
        print(f"\naxe-core checked {len(sweep.checked)} pages and states; violations:\n{sweep.report() or 'none'}")
        print(sweep.timings())
    failing = sweep.failing()
    assert not failing, f"{len(failing)} serious or critical axe-core violations:\n" + "\n".join(
        v.line() for v in sorted(failing, key=lambda v: (v.rule, v.page, v.role)))

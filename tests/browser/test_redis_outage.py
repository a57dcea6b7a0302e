"""The console while Redis is down: pages still load, the live status says so,
what an operator types stays, and live updates come back by themselves with Redis.

A real browser against daphne whose channel layer and publisher use a private Redis
(bench/servers.py) that the test stops and starts; PostgreSQL is the test database.
Runs are started by a separate client process on the same Redis (tests/faults/driver.py),
as a web process or an API client would. No workers: the runs stay PENDING, which is
all the pages need.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from bench.servers import RedisServer
from sagas.models import RunStatus, WorkflowRun
from tests.browser.conftest import MODULES, Console, start_daphne
from tests.faults.conftest import Driver
from tests.procs import Proc, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

LIVE = "live"
RECONNECTING = "live: disconnected, reconnecting…"  # console/static/console/console.js
# Redis stays down until the run page, open all along, has tried to reconnect this often: its
# backoff has then grown past the cap (htmx-ext-ws's own next delay would be up to 16 s, console.js
# caps it at 10 s).
RECONNECTS = 4
COUNT_ATTEMPTS = """window.__wsAttempts = 0;
document.addEventListener("htmx:wsConnecting", () => { window.__wsAttempts += 1; });"""
TYPED = "customer asked to hold the order until Monday"


class OutageConsole(Console):
    def __init__(self, base: str, browser, procs, daphne: Proc, driver: Driver) -> None:
        super().__init__(base, browser, procs, providers_url="")
        self.daphne, self.driver = daphne, driver


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def outage_console(procs, users, redis_server, browser, _playwright_loop):
    """A daphne of its own and a run-starting client, on the test database and the private Redis
    (the shared daphne stays on the test Redis db); the shared browser, contexts of its own."""
    env = worker_env(MODULES, REDIS_URL=redis_server.url())
    daphne, base = start_daphne(procs, env)
    driver = Driver(procs, env)
    console = OutageConsole(base, browser, procs, daphne, driver)
    try:
        yield console
    finally:
        console.close()


def pending_count(page):
    """The overview's PENDING card."""
    return page.locator("#live-overview .card.status-pending .n")


def test_it_keeps_the_console_usable_while_redis_is_down_and_goes_live_again_by_itself(
        outage_console, redis_server, tmp_path):
    console = outage_console
    first = console.driver.start_ok("capture_then_wait", {"id": "r-1"})

    # 1. An operator has the overview and a run open, both live, and starts typing a reason.
    overview = console.page("olga")
    overview.context.add_init_script(COUNT_ATTEMPTS)  # every page of the context from here on
    run_page = overview.context.new_page()
    run_page.goto(f"/runs/{first}/")
    for page in (overview, run_page):
        expect(page.locator("#live-status")).to_have_text(LIVE, timeout=15_000)
    run_page.evaluate("window.notReloaded = true")
    run_page.locator("#live-run_actions summary", has_text="Cancel").click()
    reason = run_page.locator("#live-run_actions form[action$='/cancel/'] textarea[name=reason]")
    reason.fill("customer asked to hold the order")

    # 2. Redis stops: the pages say so within seconds, and the operator can go on typing.
    stopped = time.monotonic()
    redis_server.stop()
    for page in (run_page, overview):
        expect(page.locator("#live-status")).to_have_text(RECONNECTING, timeout=15_000)
    noticed = time.monotonic() - stopped
    reason.press_sequentially(" until Monday")
    run_page.screenshot(path=str(tmp_path / "run-page-redis-down.png"), full_page=True)
    expect(reason).to_have_value(TYPED)

    # 3. Still down: a reload and other pages answer and render; runs can still be started.
    response = overview.reload()
    assert response.status == 200
    expect(overview.locator("main h1")).to_have_text("Overview")
    expect(pending_count(overview)).to_have_text("1")
    other = overview.context.new_page()
    for path, heading in (("/approvals/", "Approvals inbox"), ("/effects/", "Ambiguous effects"),
                          ("/audit/", "Audit log"), ("/runs/", "Runs")):
        response = other.goto(path)
        assert response.status == 200, (path, response.status)
        expect(other.locator("main h1")).to_have_text(heading)
    expect(other.locator("#live-runs_table")).to_contain_text(first[:8])
    answer = console.driver.start("capture_then_wait", {"id": "r-2"})
    assert answer["ok"], f"starting a run failed while Redis was down: {answer}"
    during = answer["run_id"]
    assert WorkflowRun.objects.get(id=during).status == RunStatus.PENDING
    assert other.reload().status == 200
    expect(other.locator("#live-runs_table")).to_contain_text(during[:8])
    # However long the outage, a page tries again at least every 10 s (htmx-ext-ws's own
    # backoff grows to a minute, which an operator would wait out after Redis is back).
    delays = run_page.evaluate("[...Array(200)].map(() => htmx.config.wsReconnectDelay(50))")
    assert max(delays) <= 10_000, max(delays)
    # A long outage: the run page's first connection and then RECONNECTS attempts while down.
    run_page.wait_for_function("(n) => window.__wsAttempts >= n", arg=1 + RECONNECTS, timeout=90_000)
    down_for = time.monotonic() - stopped
    for page in (overview, run_page, other):
        expect(page.locator("#live-status")).to_have_text(RECONNECTING)
    expect(reason).to_have_value(TYPED)
    assert console.daphne.alive(), console.daphne.log()

    # 4. Redis is back: every open page goes live again by itself, and pushes arrive again,
    #    from another process (a run started) and from daphne itself (an operator action).
    redis_server.start()
    back = time.monotonic()
    for page in (run_page, overview, other):
        expect(page.locator("#live-status")).to_have_text(LIVE, timeout=30_000)
    reconnected = time.monotonic() - back
    expect(reason).to_have_value(TYPED)

    after = console.driver.start_ok("capture_then_wait", {"id": "r-3"})
    expect(other.locator("#live-runs_table")).to_contain_text(after[:8], timeout=15_000)
    expect(pending_count(overview)).to_have_text("3", timeout=15_000)

    run_page.get_by_role("button", name="Cancel the run").click()
    expect(run_page.locator("#live-run_header")).to_contain_text("CANCELLED", timeout=15_000)
    row = other.locator("#live-runs_table tr.run-row", has_text=first[:8])
    expect(row).to_contain_text("CANCELLED", timeout=15_000)
    expect(pending_count(overview)).to_have_text("2", timeout=15_000)
    assert WorkflowRun.objects.get(id=first).status == RunStatus.CANCELLED
    assert run_page.evaluate("window.notReloaded === true"), "the run page was reloaded"

    # The outage is in daphne's log once when it starts and once when it ends, not as a
    # traceback per open page and per reconnect attempt. A socket read that began before
    # Redis came back may fail just after it did: that is a second, short outage, said in
    # the same two lines (core.storage.Outages), never one line per page or attempt.
    log = console.daphne.log()
    outage = [line for line in log.splitlines() if "storage outage" in line]
    starts = [line for line in outage if "storage outage:" in line]
    ends = [line for line in outage if "storage outage over:" in line]
    assert outage and "storage outage:" in outage[0] and "storage outage over:" in outage[-1], "\n".join(outage)
    assert len(starts) == len(ends) <= 2, "\n".join(outage)  # 3 pages x RECONNECTS attempts met it
    assert all("storage outage over:" in b for a, b in zip(outage[::2], outage[1::2], strict=True)), \
        "\n".join(outage)
    assert "Traceback" not in log, log[-5000:]
    print(f"\nRedis stopped: the pages said so after {noticed:.1f} s; Redis back after {down_for:.1f} s "
          f"({RECONNECTS} reconnect attempts of the run page): "
          f"every page live again after {reconnected:.1f} s, without a reload")

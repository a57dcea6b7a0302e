"""The workers page in Chromium against daphne with a real worker: the worker, its versions and
heartbeat, a stranded version, and a worker that starts while the page is open appearing by the
region's own poll, without a reload."""

from __future__ import annotations

import re

from django.utils import timezone

from sagas.models import RunStatus, WorkerProcess, WorkflowRun
from tests.procs import wait_until


def test_it_shows_live_workers_and_stranded_versions_and_follows_new_workers(console, users):
    console.worker("wk-browser")
    wait_until(lambda: WorkerProcess.objects.filter(name="wk-browser", stopped_at__isnull=True).exists(), 30,
               what="the worker registered")
    WorkflowRun.objects.create(workflow_name="retired_flow", version=3, definition_hash="f" * 64,
                               status=RunStatus.PENDING, business_key="o-stranded", tenant="acme")
    page = console.page("vic", "/workers/")

    row = page.locator('tr[data-worker="wk-browser"]')
    assert row.is_visible()
    assert "live" in row.inner_text() and re.search(r"\d+ s ago", row.inner_text())
    assert "order3 v1" in row.inner_text() and "capture_then_wait v1" in row.inner_text()
    stranded = page.locator("tr.stranded-version")
    assert stranded.count() == 1 and "retired_flow" in stranded.inner_text() and "v3" in stranded.inner_text()
    assert page.locator("nav a", has_text="Workers").get_attribute("aria-current") == "page"
    console.shot(page, "workers")

    now = timezone.now()
    WorkerProcess.objects.create(name="wk-late", hostname="host-late", pid=4242, started_at=now, last_seen_at=now,
                                 definitions=[{"name": "retired_flow", "version": 3, "hash": "f" * 64}])
    page.locator('tr[data-worker="wk-late"]').wait_for(timeout=12_000)
    page.locator("tr.stranded-version").wait_for(state="detached", timeout=12_000)
    assert "Every version with runs in flight is carried by a live worker" in page.inner_text("main")

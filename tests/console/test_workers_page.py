"""The workers page: a real worker process with its versions, heartbeat, threads and the runs it
holds; silent workers; stranded versions; tenant limits on the runs shown."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.selectors.workers import rq_threads
from operators.models import TenantScope
from sagas import start
from sagas.models import RunStatus, WorkerProcess, WorkflowRun
from sagas.runtime.queue import compensation_queue_name, redis_connection
from sagas.versions import registry
from tests.console import wf_workers  # noqa: F401  (registers the workflows in this process)
from tests.console.conftest import client_for
from tests.console.queue_data import HOSTILE, make_run, text
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = "tests.console.wf_workers"


def _row(page: str, name: str) -> str:
    """The table row of worker ``name``."""
    found = re.search(rf'<tr class="worker [^"]*" data-worker="{re.escape(name)}">.*?</tr>', page, re.S)
    assert found, f"no row for worker {name!r}"
    return found.group(0)


def _section(page: str, title: str) -> str:
    found = re.search(rf'<section[^>]*aria-labelledby="{title}">.*?</section>', page, re.S)
    assert found, f"no section {title!r}"
    return found.group(0)


def test_it_shows_a_real_worker_with_its_versions_heartbeat_threads_and_the_runs_it_holds(people, procs):
    limited = people["viewer"]
    TenantScope.objects.create(user=limited, tenants=["acme"])
    procs.worker("wk-a", MODULES, "--concurrency", "2")
    acme = start("wk_hold", {"seconds": 60}, tenant="acme", business_key="order-acme-1")
    globex = start("wk_hold", {"seconds": 60}, tenant="globex", business_key="order-globex-1")
    wait_until(lambda: WorkflowRun.objects.filter(id__in=[acme.id, globex.id], status=RunStatus.RUNNING,
                                                  lease_owner__startswith="wk-a/").count() == 2,
               30, what="both runs held by wk-a's threads")

    page = text(client_for(people["operator"]).get(reverse("console:workers")))

    row = _row(_section(page, "live-workers-title"), "wk-a")
    assert ">live<" in row
    assert "wk_hold</bdi> v1" in row and "wk_quick</bdi> v1" in row
    assert registry.get("wk_hold", 1).definition_hash[:12] in row
    assert re.search(r">\d+ s ago<", row), "the heartbeat's age in seconds"
    assert re.search(r'class="num">2<', row), "two threads (--concurrency 2)"
    assert f'href="/runs/{acme.id}/"' in row and f'href="/runs/{globex.id}/"' in row
    assert "order-acme-1" in row and "RUNNING" in row

    limited_page = text(client_for(limited).get(reverse("console:workers")))
    limited_row = _row(limited_page, "wk-a")
    assert "wk_hold</bdi> v1" in limited_row, "a tenant-limited user still sees the worker and its code"
    assert f'href="/runs/{acme.id}/"' in limited_row
    assert str(globex.id) not in limited_page and "order-globex-1" not in limited_page


def test_it_highlights_stranded_versions_and_lists_silent_and_stopped_workers(people):
    now = timezone.now()
    carried, stranded_hash = "c" * 64, "d" * 64
    WorkerProcess.objects.create(name="wk-live", hostname="host-1", pid=11, started_at=now, last_seen_at=now,
                                 definitions=[{"name": "qp_orders", "version": 1, "hash": carried}])
    WorkerProcess.objects.create(name="wk-killed", hostname="host-2", pid=12, started_at=now - timedelta(hours=1),
                                 last_seen_at=now - timedelta(minutes=3),
                                 definitions=[{"name": "qp_orders", "version": 2, "hash": stranded_hash}])
    WorkerProcess.objects.create(name="wk-done", hostname="host-3", pid=13, started_at=now - timedelta(hours=1),
                                 last_seen_at=now - timedelta(minutes=5), stopped_at=now - timedelta(minutes=5),
                                 definitions=[])
    WorkerProcess.objects.create(name="wk-ancient", hostname="host-4", pid=14, started_at=now - timedelta(days=9),
                                 last_seen_at=now - timedelta(days=8), stopped_at=now - timedelta(days=8))
    make_run(definition_hash=carried, status=RunStatus.PENDING, reason="")
    for status, reason in ((RunStatus.PENDING, ""), (RunStatus.WAITING, ""),
                           (RunStatus.NEEDS_ATTENTION, "version_mismatch")):
        make_run(version=2, definition_hash=stranded_hash, status=status, reason=reason)
    make_run(version=2, definition_hash=stranded_hash, status=RunStatus.COMPLETED, reason="")
    make_run(name=HOSTILE, version=3, definition_hash="e" * 64, status=RunStatus.WAITING, reason="")

    page = text(client_for(people["viewer"]).get(reverse("console:workers")))

    stranded = _section(page, "stranded-versions-title")
    rows = re.findall(r'<tr class="attention stranded-version">.*?</tr>', stranded, re.S)
    assert len(rows) == 2, "v2 (its only worker went silent) and the hostile-named v3; not v1, carried by wk-live"
    v2 = next(r for r in rows if stranded_hash[:12] in r)
    assert "qp_orders</bdi></td><td>v2" in v2 and re.search(r">3</a>", v2), "3 runs in flight, not the completed one"
    assert "/runs/?workflow=qp_orders&amp;version=2" in v2
    assert HOSTILE not in page and "&lt;script&gt;" in stranded
    assert carried[:12] not in stranded
    assert ">silent<" in _row(_section(page, "silent-workers-title"), "wk-killed")
    assert "5 min ago" in _row(_section(page, "stopped-workers-title"), "wk-done")
    assert "wk-ancient" not in page and "1 older registry" in page


def test_it_says_when_no_worker_is_live(people):
    make_run(status=RunStatus.PENDING, reason="")

    page = text(client_for(people["viewer"]).get(reverse("console:workers")))

    assert "No worker is live" in page
    assert len(re.findall(r'<tr class="attention stranded-version">', page)) == 1


def test_it_serves_the_region_alone_to_its_poll_and_refuses_people_without_a_role(people):
    client = client_for(people["viewer"])

    region = text(client.get(reverse("console:workers"), headers={"HX-Request": "true"}))

    assert region.lstrip().startswith('<div id="live-workers_list"') and 'hx-trigger="every 5s"' in region
    assert "<html" not in region
    assert client_for(people["nobody"]).get(reverse("console:workers")).status_code == 403


def test_it_still_lists_workers_when_redis_is_away_with_their_threads_unknown(people, settings):
    now = timezone.now()
    WorkerProcess.objects.create(name="wk-no-redis", hostname="host-1", pid=21, started_at=now, last_seen_at=now,
                                 definitions=[{"name": "qp_orders", "version": 1, "hash": "c" * 64}])
    # The engine's Redis (RQ's registry of threads) on the discard port, where nothing listens.
    settings.RQ_QUEUES = {compensation_queue_name(): {"URL": "redis://127.0.0.1:9/0"}}
    redis_connection.cache_clear()
    try:
        assert redis_connection().connection_pool.connection_kwargs["port"] == 9
        assert rq_threads() is None
        response = client_for(people["viewer"]).get(reverse("console:workers"))
    finally:
        redis_connection.cache_clear()

    assert response.status_code == 200
    row = _row(_section(text(response), "live-workers-title"), "wk-no-redis")
    assert ">live<" in row and 'class="num">–<' in row, "threads not known, the worker still listed"

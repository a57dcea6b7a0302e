"""The versions page: hashes, runs in flight, workers and stranded runs; the source diff."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from sagas.models import (
    RunStatus,
    WorkerProcess,
    WorkflowVersion,
)
from tests.console.conftest import client_for
from tests.console.queue_data import (
    ESCAPED,
    HOSTILE,
    make_run,
    text,
)

pytestmark = pytest.mark.django_db


def test_it_shows_each_version_with_its_hashes_runs_in_flight_workers_and_stranded_runs(people):
    old_hash, new_hash, v2_hash = "1" * 64, "2" * 64, "3" * 64
    for version, h in ((1, old_hash), (1, new_hash), (2, v2_hash)):
        WorkflowVersion.objects.create(name="qp_orders", version=version, definition_hash=h,
                                       source=f"def f():\n    return {version}\n", module="tests.qp")
    for _ in range(2):
        make_run(definition_hash=old_hash, status=RunStatus.WAITING, reason="")
    stranded = make_run(definition_hash=old_hash, status=RunStatus.NEEDS_ATTENTION, reason="version_mismatch")
    make_run(definition_hash=old_hash, status=RunStatus.COMPLETED, reason="")
    make_run(definition_hash=new_hash, status=RunStatus.RUNNING, reason="")
    now = timezone.now()
    WorkerProcess.objects.create(name="worker-a", hostname="h", pid=1, started_at=now, last_seen_at=now,
                                 definitions=[{"name": "qp_orders", "version": 1, "hash": new_hash}])
    WorkerProcess.objects.create(name="worker-dead", hostname="h", pid=2, started_at=now, last_seen_at=now,
                                 stopped_at=now, definitions=[{"name": "qp_orders", "version": 1, "hash": old_hash}])

    page = text(client_for(people["viewer"]).get(reverse("console:versions")))

    assert "qp_orders" in page and "2 hashes" in page
    rows = {h[:12]: row for row in re.findall(r"<tr.*?</tr>", page, re.S) for h in (old_hash, new_hash, v2_hash)
            if f">{h[:12]}<" in row}
    assert re.search(r'class="num">3<', rows[old_hash[:12]])  # 2 waiting + 1 stranded; the completed one is not
    assert "none: these runs cannot resume" in rows[old_hash[:12]] and "worker-dead" not in page
    assert re.search(r'class="num">1<', rows[new_hash[:12]]) and "worker-a" in rows[new_hash[:12]]
    assert re.search(r'class="num">0<', rows[v2_hash[:12]])
    assert f'href="/runs/{stranded.id}/"' in page


def test_it_diffs_two_versions_of_a_workflow_with_the_changed_line_escaped(people):
    a = WorkflowVersion.objects.create(name="qp_orders", version=1, definition_hash="1" * 64, module="m",
                                       source='def f(ctx):\n    ctx.step("plan")\n    return "ok"\n')
    b = WorkflowVersion.objects.create(name="qp_orders", version=2, definition_hash="2" * 64, module="m",
                                       source=f'def f(ctx):\n    ctx.step("plan")\n    return "{HOSTILE}"\n')
    other = WorkflowVersion.objects.create(name="qp_other", version=1, definition_hash="9" * 64, module="m",
                                           source="x\n")
    client = client_for(people["viewer"])

    page = text(client.get(reverse("console:version_diff") + f"?a={a.id}&b={b.id}"))

    assert '<span class="diff-line removed">-    return &quot;ok&quot;</span>' in page
    assert f'<span class="diff-line added">+    return &quot;{ESCAPED}&quot;</span>' in page
    assert '<span class="diff-line context">     ctx.step(&quot;plan&quot;)</span>' in page
    assert HOSTILE not in page
    assert client.get(reverse("console:version_diff") + f"?a={a.id}&b={other.id}").status_code == 400
    assert client.get(reverse("console:version_diff") + f"?a={a.id}&b=999999").status_code == 404
    versions_page = text(client.get(reverse("console:versions")))
    assert reverse("console:version_diff") in versions_page and f'<option value="{b.id}"' in versions_page

"""Move, redrive and the replay check on the console: the run page's Move… and Redrive…, the
versions page's replay check (counts, examples, the sources side by side). Roles, audit, the
refusals of a divergent move and a stale page, and hostile names escaped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from operators.models import AuditOutcome
from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun, WorkflowVersion
from sagas.testing import advance_clock, frozen_clock, run_until_idle, sweep_once
from sagas.versions import registry
from tests.console.conftest import client_for
from tests.console.run_data import audits, run_url, text
from tests.sagas import wf_repair  # noqa: F401  (rm_order versions 1, 2 and 3 in this process)

pytestmark = pytest.mark.django_db


def register_versions() -> None:
    """The versions table, as a worker's start-up writes it (the check page shows their sources)."""
    for d in registry.all_definitions():
        if d.name == "rm_order":
            WorkflowVersion.objects.get_or_create(name=d.name, version=d.version, definition_hash=d.definition_hash,
                                                  defaults={"source": d.source, "module": d.module})


def waiting(order: str) -> WorkflowRun:
    run = start("rm_order", {"id": order}, version=1, business_key=order)
    run_until_idle(run.id)
    return WorkflowRun.objects.get(id=run.id)


def post(client, run, action: str, **data):
    form = {"reason": "fix for the tax rounding", "expected": run.status}
    form.update(data)
    return client.post(reverse(f"console:run_{action}", args=[run.id]), form)


def test_an_operator_moves_a_waiting_run_to_the_fix_and_it_is_audited_and_in_its_history(people):
    run = waiting("o-1")
    client = client_for(people["operator"])
    page = text(client.get(run_url(run)))
    assert reverse("console:run_move", args=[run.id]) in page
    assert '<option value="2">version 2</option>' in page and '<option value="3">version 3</option>' in page

    assert post(client, run, "move", version="2").status_code == 302
    run.refresh_from_db()
    assert run.version == 2
    [entry] = audits(run, "run.move")
    assert entry.outcome == AuditOutcome.OK and (entry.before["version"], entry.after["version"]) == (1, 2)
    history = text(client.get(reverse("console:run_history", args=[run.id])))
    assert "moved" in history and "fix for the tax rounding" in history


def test_a_divergent_move_is_refused_with_where_and_a_viewer_is_denied(people):
    run = waiting("o-2")
    refused = post(client_for(people["operator"]), run, "move", version="3")
    assert refused.status_code == 409 and "does not replay on rm_order version 3" in text(refused)
    assert "reserve_stock" in text(refused)
    assert WorkflowRun.objects.get(id=run.id).version == 1
    assert post(client_for(people["viewer"]), run, "move", version="2").status_code == 403
    assert [a.outcome for a in sorted(audits(run, "run.move"), key=lambda a: a.id)] == [
        AuditOutcome.REFUSED, AuditOutcome.DENIED]
    malformed = post(client_for(people["operator"]), run, "move", version="two")
    assert malformed.status_code == 400 and "is not a version number" in text(malformed)


def test_an_operator_redrives_a_failed_run_onto_the_fix(people):
    with frozen_clock():
        run = waiting("o-3")
        advance_clock(timedelta(hours=2))
        sweep_once()
        failed = run_until_idle(run.id)
        assert failed.status == RunStatus.FAILED
        client = client_for(people["operator"])
        page = text(client.get(run_url(failed)))
        assert reverse("console:run_redrive", args=[run.id]) in page
        assert post(client, failed, "redrive", version="2").status_code == 302
        done = run_until_idle(run.id)
    assert done.status == RunStatus.COMPLETED and done.version == 2
    assert JournalEntry.objects.filter(run=run, kind="redriven").count() == 1
    [entry] = audits(run, "run.redrive")
    assert entry.outcome == AuditOutcome.OK and entry.before["state"] == "FAILED"


def test_the_versions_page_checks_runs_in_flight_against_a_version_and_shows_the_sources(people):
    register_versions()
    waiting("o-4")
    waiting("o-5")
    client = client_for(people["viewer"])  # reading: any role
    assert reverse("console:version_check") in text(client.get(reverse("console:versions")))

    fix = text(client.get(reverse("console:version_check"), {"workflow": "rm_order", "version": "2"}))
    assert 'class="badge COMPLETED">2<' in fix and "2 runs in flight could move to this version" in fix
    assert 'aria-label="v1 source"' in fix and 'aria-label="v2 source"' in fix
    broken = text(client.get(reverse("console:version_check"), {"workflow": "rm_order", "version": "3"}))
    assert 'class="badge FAILED">2<' in broken
    assert "the journal has step “<bdi>reserve</bdi>”, the code asks for step “<bdi>reserve_stock</bdi>”" in broken
    assert JournalEntry.objects.filter(kind="moved").count() == 0  # checking changed nothing

    hostile = client.get(reverse("console:version_check"), {"workflow": "<script>x</script>", "version": "1"})
    assert hostile.status_code == 400 and "<script>x</script>" not in text(hostile)
    assert client.get(reverse("console:version_check"), {"workflow": "rm_order", "version": "x"}).status_code == 400

"""The page of an archived run: it says when and where the run went, and shows it from its
archive file, read-only, escaped and redacted; only to those who may see its tenant."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from operators.models import TenantScope
from sagas import start
from sagas.models import ArchivedRun, RunStatus, WorkflowRun
from sagas.replay.engine import advance
from sagas.retention.archiving import archive_due
from tests.console.conftest import client_for
from tests.console.run_data import IMG, IMG_ESCAPED, SCRIPT, SCRIPT_ESCAPED, run_url, text
from tests.sagas import wf_retention  # noqa: F401  (registers ret_order)

pytestmark = pytest.mark.django_db


@pytest.fixture
def archived(tmp_path, settings):
    settings.SAGAS_ARCHIVE_URL = (tmp_path / "archive").as_uri()
    run = start("ret_order", {"id": SCRIPT, "note": IMG, "password": "hunter2-do-not-show"},
                business_key=f"bk-{SCRIPT}", tenant="acme")
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    WorkflowRun.objects.filter(id=run.id).update(finished_at=timezone.now() - timedelta(days=45))
    assert archive_due().runs == 1
    return ArchivedRun.objects.get(run_id=run.id)


def test_it_opens_an_archived_run_from_its_file_escaped_and_redacted(people, archived):
    response = client_for(people["viewer"]).get(run_url(type("R", (), {"id": archived.run_id})))
    page = text(response)
    assert response.status_code == 200
    assert f"Archived on {archived.archived_at:%Y-%m-%d %H:%M:%S} UTC to" in page
    assert archived.location in page
    # header, history, effects from the file
    assert "ret_order" in page and "COMPLETED" in page
    assert "charge-" in page and "SUCCEEDED" in page  # the effect's key and status
    assert "started" in page and "completed" in page  # journal kinds
    # hostile values escaped, secrets redacted
    assert SCRIPT not in page and IMG not in page
    assert SCRIPT_ESCAPED in page and IMG_ESCAPED in page
    assert "hunter2-do-not-show" not in page
    # read-only: no action of a live run's page
    assert "/cancel/" not in page and "/retry/" not in page and "/compensate/" not in page


def test_it_hides_an_archived_run_outside_the_users_tenants(people, archived):
    TenantScope.objects.create(user=people["viewer"], tenants=["other"])
    assert client_for(people["viewer"]).get(run_url(type("R", (), {"id": archived.run_id}))).status_code == 404


def test_it_says_so_when_the_archive_file_is_gone(people, archived):
    from sagas.retention.store import FileStore

    FileStore.path_of(archived.location).unlink()
    response = client_for(people["viewer"]).get(run_url(type("R", (), {"id": archived.run_id})))
    page = text(response)
    assert response.status_code == 200
    assert "The archive file could not be read" in page and "FileNotFoundError" in page
    assert "Archived on" in page

"""A worker says when it is ready (``sagas_worker --ready-file``) and the registry says which
workers are live (``sagas.workers()``), without reading any log. Real worker processes."""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime

import pytest

import sagas
from sagas import start
from sagas.models import RunStatus, WorkflowRun
from sagas.versions import registry
from tests.procs import wait_until
from tests.sagas import wf_engine  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_it_writes_the_ready_file_once_taking_jobs_and_removes_it_on_sigterm(procs, step_calls, tmp_path,
                                                                             concurrency):
    ready = tmp_path / "worker.ready"
    worker = procs.worker("rw", MODULES, "--ready-file", str(ready), "--concurrency", concurrency)
    wait_until(ready.exists, 60, what="the ready file")
    content = json.loads(ready.read_text())
    assert content["name"] == "rw" and content["pid"] == worker.pid and content["hostname"]
    assert content["concurrency"] == int(concurrency)
    carried = {(v["name"], v["version"], v["hash"]) for v in content["versions"]}
    for definition in registry.all_definitions():
        if definition.module == MODULES:
            assert (definition.name, definition.version, definition.definition_hash) in carried
    assert datetime.fromisoformat(content["started_at"]) <= datetime.now().astimezone()

    # Ready means registered: the registry lists it as live with the same versions, at once.
    [status] = [w for w in sagas.workers() if w.name == "rw"]
    assert status.live and status.pid == worker.pid and status.stopped_at is None
    # The registry also announces each definition's legacy hash (runs started before the
    # whole-module hash are routed to it); the ready file names the current ones.
    announced = {(v["name"], v["version"], v["hash"]) for v in status.versions}
    assert {(n, v) for n, v, _ in announced} == {(n, v) for n, v, _ in carried}
    assert carried <= announced
    # ... and taking jobs: a run started now is advanced by it.
    run = start("five_steps", {})
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 60,
               what="the run to complete on the ready worker")

    worker.signal(signal.SIGTERM)
    worker.popen.wait(timeout=60)
    assert worker.popen.returncode == 0, worker.log()
    assert not ready.exists()  # a clean exit removes it
    assert "rw" not in {w.name for w in sagas.workers()}
    [stopped] = [w for w in sagas.workers(include_stopped=True) if w.name == "rw"]
    assert not stopped.live and stopped.stopped_at is not None


def test_it_keeps_the_ready_file_of_a_sigkilled_worker_with_a_pid_that_is_gone(procs, tmp_path):
    """SIGKILL leaves no chance to clean up: the file stays, and its pid says the worker is gone."""
    ready = tmp_path / "worker.ready"
    worker = procs.worker("rk", MODULES, "--ready-file", str(ready))
    wait_until(ready.exists, 60, what="the ready file")
    worker.kill()
    pid = json.loads(ready.read_text())["pid"]
    assert pid == worker.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_last_beat_racing_the_goodbye_does_not_mark_a_stopped_worker_alive_again():
    """A worker's background thread may beat while the process says goodbye on its way out
    (SIGTERM). Whatever the order, the registry ends with the worker stopped; a restart under
    the same name (a new start time) is alive again."""
    from datetime import timedelta

    from django.utils import timezone

    from sagas import services
    from sagas.models import WorkerProcess

    began = timezone.now()
    services.worker_beat(name="w9", hostname="h", pid=1, started_at=began)
    services.worker_stopped(name="w9")
    services.worker_beat(name="w9", hostname="h", pid=1, started_at=began)  # the beat that was on its way
    assert WorkerProcess.objects.get(name="w9").stopped_at is not None
    services.worker_beat(name="w9", hostname="h", pid=2, started_at=began + timedelta(seconds=5))  # restarted
    restarted = WorkerProcess.objects.get(name="w9")
    assert restarted.stopped_at is None and restarted.pid == 2

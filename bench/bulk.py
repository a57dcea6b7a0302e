"""Bulk actions at size: a batch of 10,000 UNKNOWN effects resolved, and one of 10,000 runs
cancelled, by real worker processes, as an operator confirms them in the console.

For each batch: the wall time from the confirmation to the batch being done, items per
second, the audit entries written (one per item plus one for the batch), and the progress
updates observed: the live pushes (``bulk`` topic) a page following the batch would have been
sent, counted by a subscriber on the channel layer, and the distinct progress values a poller
reading the batch 10 times a second saw.

Uses its own database (``saga_bench_bulk``; ``saga_bench_bulk_smoke`` with ``--smoke``) and
Redis db 12 (11 with ``--smoke``).

    .venv/bin/python bench/bulk.py            # 10,000 items per batch
    .venv/bin/python bench/bulk.py --smoke    # 200 (the test suite runs this)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

SIZES = {"full": dict(items=10_000, db="saga_bench_bulk", redis=12, workers=2, concurrency=2),
         "smoke": dict(items=200, db="saga_bench_bulk_smoke", redis=11, workers=1, concurrency=2)}


def setup(size: dict) -> dict[str, str]:
    base = common.BENCH_DB.rsplit("/", 1)[0]
    common.BENCH_DB = f"{base}/{size['db']}"
    redis = common.BENCH_REDIS.rsplit("/", 1)[0] + f"/{size['redis']}"
    common.BENCH_REDIS = redis
    extra = dict(DEBUG="false", ALLOWED_HOSTS="127.0.0.1,localhost", SAGAS_LEASE_TTL="15", SAGAS_SWEEP_INTERVAL="2",
                 SECRET_KEY="bench-bulk-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz")
    common.setup_django(**extra)
    return common.bench_env(**extra)


def reset() -> None:
    from django.db import connection

    from core.append_only import TRUNCATE_ESCAPE_GUC
    from sagas.runtime.queue import redis_connection

    with connection.cursor() as cur:
        cur.execute(f"SET {TRUNCATE_ESCAPE_GUC} = on")
        cur.execute("TRUNCATE console_bulkitem, console_bulkbatch, console_auditentry, ledger_effectrecord, "
                    "sagas_journalentry, sagas_workflowrun CASCADE")
        cur.execute(f"RESET {TRUNCATE_ESCAPE_GUC}")
    redis_connection().flushdb()


def operator():  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from operators import roles

    roles.ensure_groups()
    user, _ = get_user_model().objects.get_or_create(username="bench-bulk-operator")
    user.groups.add(Group.objects.get(name=roles.OPERATOR))
    return get_user_model().objects.get(pk=user.pk)


def make_runs(n: int, status: str, reason: str):  # type: ignore[no-untyped-def]
    from sagas.models import WorkflowRun

    runs = [WorkflowRun(id=uuid.uuid4(), workflow_name="bench_bulk", version=1, definition_hash="b" * 64,
                        status=status, status_reason=reason, business_key=f"bulk-{status}-{i}", tenant=f"t{i % 8}")
            for i in range(n)]
    WorkflowRun.objects.bulk_create(runs, batch_size=2000)
    return runs


def make_effects(n: int) -> None:
    from django.utils import timezone

    from ledger.models import EffectRecord, EffectStatus

    runs = make_runs(n, "NEEDS_ATTENTION", "effect_unknown")
    now = timezone.now()
    EffectRecord.objects.bulk_create([
        EffectRecord(tenant=r.tenant, idempotency_key=f"mail-{r.id}", run_id=r.id, step_name="send", connector="email.send",
                     request_payload={"to": "x@example.com"}, payload_hash="0" * 64,
                     status=EffectStatus.UNKNOWN, intent_at=now, dispatched_at=now, attempts=1)
        for r in runs], batch_size=2000)


class Pushes:
    """Counts the live pushes on the ``bulk`` topic (what a page following the batch hears)."""

    def __init__(self) -> None:
        self.count = 0
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)
        self.thread.start()
        self.ready.wait(10)

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        from console import topics

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(topics.group_for(topics.BULK), channel)
        self.ready.set()
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(layer.receive(channel), timeout=0.5)
                self.count += 1
            except TimeoutError:
                pass


def run_batch(label: str, action: str, user, fields: dict[str, str],  # type: ignore[no-untyped-def]
              filters: dict[str, str], pushes: Pushes) -> tuple[str, ...]:
    from console.models import BulkBatch
    from console.services.bulk import batch_confirm, batch_preview
    from operators.models import AuditEntry
    from operators.services.actions import Actor

    actor = Actor(user=user, ip="127.0.0.1")
    t0 = time.perf_counter()
    batch = batch_preview(actor, action=action, ids=None, filters=filters)
    previewed = time.perf_counter() - t0
    audit_before = AuditEntry.objects.count()
    heard = pushes.count
    seen: set[int] = set()
    start = time.perf_counter()
    batch_confirm(actor, token=batch.token, reason=f"bench: {label}", confirmed=True, **fields)
    while True:
        b = BulkBatch.objects.get(id=batch.id)
        seen.add(b.done)
        if b.state == "done":
            break
        if time.perf_counter() - start > 1800:
            raise SystemExit(f"{label}: not done after 30 minutes ({b.done} of {b.total})")
        time.sleep(0.1)
    wall = time.perf_counter() - start
    time.sleep(1.0)  # the last push
    written = AuditEntry.objects.count() - audit_before
    return (label, f"{b.total:,}", f"{b.ok:,}", f"{b.refused + b.denied:,}", f"{b.total / wall:.0f}", f"{wall:.1f} s", f"{previewed:.1f} s",
            f"{written:,}", str(pushes.count - heard), str(len(seen)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help=f"{SIZES['smoke']['items']} items per batch")
    parser.add_argument("--workers", type=int, default=None, help="worker processes")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "full"]
    workers = args.workers or size["workers"]
    env = setup(size)
    reset()
    user = operator()
    make_effects(size["items"])
    make_runs(size["items"], "WAITING", "")
    logs = Path(tempfile.mkdtemp(prefix="bench-bulk-"))
    procs = [subprocess.Popen([sys.executable, "manage.py", "sagas_worker", "--name", f"bulk-{i}", "--concurrency",
                               str(size["concurrency"])], cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(logs / f"bulk-{i}.log", "wb"), start_new_session=True)
             for i in range(workers)]  # stderr to a file: a pipe nobody reads would block a chatty worker
    try:
        from sagas.models import WorkerProcess

        common.wait_for(lambda: WorkerProcess.objects.filter(name__startswith="bulk-", stopped_at=None).count()
                        >= workers, 60)
        rows = [("batch", "items", "acted on", "refused", "items/s", "wall time", "preview", "audit entries written",
                 "live pushes", "progress values polled")]
        pushes = Pushes()  # one subscriber for both: the channel layer keeps its connections per event loop
        rows.append(run_batch("resolve UNKNOWN effects", "effect.resolve", user,
                              {"outcome": "succeeded", "evidence": "mail-log-export"}, {"connector": "email.send"},
                              pushes))
        rows.append(run_batch("cancel WAITING runs", "run.cancel", user, {}, {"status": "WAITING"}, pushes))
        pushes.stop.set()
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
    print(f"worker logs: {logs}")
    common.print_table(
        f"Bulk actions ({workers} worker process{'es' if workers > 1 else ''} × {size['concurrency']} threads, "
        f"from the confirmation to done)", rows)


if __name__ == "__main__":
    main()

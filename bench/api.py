"""The HTTP API's cost: runs started through ``POST /api/v1/runs`` against ``sagas.start()``
called in-process, and the long-poll's latency from a run finishing to the answer.

    .venv/bin/python bench/api.py            # 1,000 sequential starts each way, 8 x 250 concurrent, 64 long-polls
    .venv/bin/python bench/api.py --smoke    # a few dozen of each (run by the test suite, ~15 s)

Uses its own database (``saga_bench_api``, ``saga_bench_api_smoke`` with ``--smoke``) and Redis
db 2 (1 with ``--smoke``); DEBUG off, as in production. The API is served by one daphne
process on this machine; clients are threads of this process, each with its own keep-alive
HTTP connection. Prints one table. Figures:

* start, 1 client: p50/p95 of one start, ``start()`` in a transaction in this process vs. one
  ``POST /runs`` (auth with an operator key, rate limit in Redis, audit row, JSON both ways),
  in-process through ``django.test.Client`` (the API's own cost: one kept database connection,
  no HTTP) and over HTTP to daphne; "added" is the difference of the p50s (target < 5 ms).
  Over daphne the request's database connection comes from the web process's pool
  (config/asgi.py, DB_POOL_SIZE): ASGI runs each request's sync code in a thread of its own;
* starts per second with 8 concurrent clients, each way (no worker runs: starts only);
* long-poll: 8 clients each start a run (one step sleeping 0.2 s) and at once
  ``GET /runs/{id}?wait=30``; latency = the answer's arrival (``time.time()``) minus the run's
  ``finished_at`` (PostgreSQL ``now()`` of the finishing transaction, same clock), so it includes
  that transaction's commit, the NOTIFY, the wake-up, one read and the HTTP answer
  (target p95 < 100 ms). Every answer must be COMPLETED, never a timeout.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.servers import free_port

SIZES = {
    "full": dict(sequential=1000, clients=8, per_client=250, polls=64, db="saga_bench_api", redis=2),
    "smoke": dict(sequential=30, clients=8, per_client=10, polls=16, db="saga_bench_api_smoke", redis=1),
}
WARMUPS = 20
WORKFLOW = "bench_pure20"
TARGET_ADDED_MS = 5.0
TARGET_POLL_P95_MS = 100.0


def django_env(db: str, redis: int) -> dict[str, str]:
    common.BENCH_DB = common.BENCH_DB.rsplit("/", 1)[0] + f"/{db}"
    common.BENCH_REDIS = common.BENCH_REDIS.rsplit("/", 1)[0] + f"/{redis}"
    return dict(DEBUG="false", SECRET_KEY="bench-api-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
                ALLOWED_HOSTS="127.0.0.1,localhost", DB_CONN_MAX_AGE="0")


class Client:
    """One keep-alive HTTP connection to the API with a key."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: object = None, **headers: str) -> tuple[int, dict]:
        data = json.dumps(body) if body is not None else None
        self.conn.request(method, f"/api/v1{path}", body=data, headers={**self.headers, **headers})
        response = self.conn.getresponse()
        return response.status, json.loads(response.read() or b"null")

    def close(self) -> None:
        self.conn.close()


def start_direct(tag: str) -> None:
    from django.db import transaction

    from sagas import start

    with transaction.atomic():
        start(WORKFLOW, {"tag": tag}, business_key=tag)


def start_in_process(client, tag: str) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/api/v1/runs", {"workflow": WORKFLOW, "input": {"tag": tag}},
                           content_type="application/json", headers={"Idempotency-Key": tag})
    if response.status_code != 201:
        raise SystemExit(f"POST /runs in-process answered {response.status_code}: {response.content[:500]}")


def start_api(client: Client, tag: str) -> None:
    status, body = client.call("POST", "/runs", {"workflow": WORKFLOW, "input": {"tag": tag}},
                               **{"Idempotency-Key": tag})
    if status != 201:
        raise SystemExit(f"POST /runs answered {status}: {body}")


def sequential(fn, n: int, prefix: str) -> list[float]:  # type: ignore[no-untyped-def]
    for i in range(WARMUPS):
        fn(f"{prefix}-warm-{i}")
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(f"{prefix}-{i}")
        took.append((time.perf_counter() - t0) * 1000)
    return took


def concurrent(make_fn, clients: int, per_client: int, prefix: str) -> float:  # type: ignore[no-untyped-def]
    """Starts per second with ``clients`` threads each doing ``per_client`` starts."""
    barrier = threading.Barrier(clients + 1)

    def one(c: int) -> None:
        fn = make_fn()
        fn(f"{prefix}-c{c}-warm")
        barrier.wait()
        for i in range(per_client):
            fn(f"{prefix}-c{c}-{i}")

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(one, c) for c in range(clients)]
        barrier.wait()
        t0 = time.perf_counter()
        for f in futures:
            f.result()
    return clients * per_client / (time.perf_counter() - t0)


class NotifyClock:
    """A second ``LISTEN saga_run_status`` in this process: when each run's COMPLETED was heard,
    which splits a long-poll's latency into commit-to-NOTIFY and NOTIFY-to-answer."""

    def __init__(self) -> None:
        import psycopg
        from django.db import connection

        params = {k: v for k, v in connection.get_connection_params().items()
                  if k in {"host", "port", "user", "password", "dbname"}}
        self.conn = psycopg.connect(autocommit=True, **params)
        self.conn.execute("LISTEN saga_run_status")
        self.heard: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for notify in self.conn.notifies(timeout=0.5):
                run_id, _, status = notify.payload.partition(":")
                if status == "COMPLETED":
                    self.heard[run_id] = time.time()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.conn.close()


def long_polls(port: int, key: str, clients: int, total: int) -> tuple[list[float], list[float]]:
    """Latency (ms) from each run's finished_at to the long-poll's answer, and from the
    NOTIFY (as heard by another listener) to the answer."""
    lags: list[float] = []
    after_notify: list[float] = []
    lock = threading.Lock()
    clock = NotifyClock()

    def one(c: int) -> None:
        client = Client(port, key)
        try:
            for i in range(total // clients):
                tag = f"poll-c{c}-{i}"
                status, run = client.call("POST", "/runs", {"workflow": "bench_sleepy",
                                                            "input": {"steps": 1, "sleep": 0.2}},
                                          **{"Idempotency-Key": tag})
                assert status == 201, run
                status, run = client.call("GET", f"/runs/{run['id']}?wait=30")
                answered = time.time()
                if status != 200 or run["status"] != "COMPLETED":
                    raise SystemExit(f"a long-poll answered {status} {run.get('status')}: {run}")
                with lock:
                    lags.append((answered - datetime.fromisoformat(run["finished_at"]).timestamp()) * 1000)
                    if run["id"] in clock.heard:
                        after_notify.append((answered - clock.heard[run["id"]]) * 1000)
        finally:
            client.close()

    try:
        with ThreadPoolExecutor(clients) as pool:
            for f in [pool.submit(one, c) for c in range(clients)]:
                f.result()
    finally:
        clock.close()
    return lags, after_notify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "full"]
    extra = django_env(size["db"], size["redis"])
    common.setup_django(**extra)
    env = common.bench_env(**extra)
    common.reset_state()

    from api.keys import apikey_create

    # A rate high enough never to refuse, so its Redis round trip is measured as in production.
    key = apikey_create(name=f"bench-{os.getpid()}-{time.time_ns()}", role="operator", rate_per_minute=10**9)[1]

    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-api-daphne-{os.getpid()}.log"
    procs: list[subprocess.Popen] = []
    with open(log_path, "wb") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        if not common.wait_for(lambda: "Listening on TCP address" in log_path.read_text(errors="replace")
                               or procs[0].poll() is not None, 30) or procs[0].poll() is not None:
            raise SystemExit(f"daphne did not start: {log_path.read_text(errors='replace')[-2000:]}")

        direct = sequential(start_direct, size["sequential"], "direct")
        from django.test import Client as DjangoClient

        django_client = DjangoClient(SERVER_NAME="localhost", HTTP_AUTHORIZATION=f"Bearer {key}")
        in_process = sequential(lambda tag: start_in_process(django_client, tag), size["sequential"], "inproc")
        client = Client(port, key)
        via_api = sequential(lambda tag: start_api(client, tag), size["sequential"], "api")
        client.close()
        direct_rate = concurrent(lambda: start_direct, size["clients"], size["per_client"], "direct-par")
        api_rate = concurrent(lambda: (lambda tag, c=Client(port, key): start_api(c, tag)),
                              size["clients"], size["per_client"], "api-par")

        common.reset_state()  # the starts above are PENDING: the worker must not work through them first
        procs.append(common.spawn_worker("--concurrency", str(size["clients"]), env=env))
        polls, after_notify = long_polls(port, key, size["clients"], size["polls"])
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    d50, a50 = common.percentile(direct, 50), common.percentile(via_api, 50)
    added = a50 - d50
    p50, p95 = common.percentile(polls, 50), common.percentile(polls, 95)
    i50 = common.percentile(in_process, 50)
    table = [
        ("figure", "start() in-process", "API in-process", "API over HTTP", "added by the API", "target"),
        (f"one start, 1 client, p50 ({size['sequential']} starts)", f"{d50:.2f} ms", f"{i50:.2f} ms",
         f"{a50:.2f} ms", f"{added:.2f} ms ({i50 - d50:.2f} in-process)", f"< {TARGET_ADDED_MS:g} ms added"),
        ("one start, 1 client, p95", f"{common.percentile(direct, 95):.2f} ms",
         f"{common.percentile(in_process, 95):.2f} ms", f"{common.percentile(via_api, 95):.2f} ms", "", ""),
        (f"starts per second, {size['clients']} clients x {size['per_client']}", f"{direct_rate:.0f}/s", "",
         f"{api_rate:.0f}/s", "", ""),
        (f"long-poll, finished_at to answer ({len(polls)} runs, {size['clients']} clients): p50", "", "",
         f"{p50:.1f} ms", "", ""),
        ("long-poll, finished_at to answer: p95", "", "", f"{p95:.1f} ms", "", f"< {TARGET_POLL_P95_MS:g} ms"),
        ("long-poll, NOTIFY heard to answer: p50", "", "", f"{common.percentile(after_notify, 50):.1f} ms", "", ""),
        ("long-poll, NOTIFY heard to answer: p95", "", "", f"{common.percentile(after_notify, 95):.1f} ms", "", ""),
    ]
    common.print_table(f"API (one daphne process, keep-alive clients, DEBUG off; workflow {WORKFLOW})", table)
    met = added < TARGET_ADDED_MS and p95 < TARGET_POLL_P95_MS
    print(f"\nTargets: {'met' if met else 'NOT met'} (API added {added:.2f} ms p50; long-poll p95 {p95:.1f} ms)")


if __name__ == "__main__":
    main()

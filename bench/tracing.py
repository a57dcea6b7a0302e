"""What tracing costs a worker: runs advanced in this process with tracing off and on
(OpenTelemetry's batch processor exporting OTLP/HTTP to a real receiver process), in turns.

    .venv/bin/python bench/tracing.py            # 40 cycles of 2 x 25 runs (about 3 minutes)
    .venv/bin/python bench/tracing.py --smoke    # 3 cycles of 2 x 10 runs

Its own database (``saga_bench_tracing``; ``_smoke``) and a private ``redis-server``
(``bench/servers.py``: every database of the shared one is taken). Each run of
``bench_traced`` is 10 pure steps and 5 effects on a connector that calls nothing (16 spans
with its attempt), advanced by ``sagas.replay.engine.advance`` in one thread, as a worker's
thread does it: what is measured is the engine's own path (its commits included) with and
without spans, the heaviest case for tracing (a real step waits on a model or a provider,
which tracing does not slow). A cycle is a batch of runs with tracing off, then one with it
on (``sagas.tracing.start_exporting`` with the OTLP exporter and a ``BatchSpanProcessor``,
flushed before the batch's clock stops, so the export's encoding and request are counted);
the receiver is ``tests/sagas/otlp_receiver.py``. Figures: wall time and this process's CPU
time per run (the exporter's thread included), medians over the cycles, and the median of
each cycle's on/off ratio, which the machine's other load moves least (both batches of a
cycle see the same minute). Each run is claimed once: the query a later claim makes for an
attempt a killed worker left (``sagas.tracing``) is not in the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.servers import RedisServer

SIZES = {"full": {"runs": 25, "cycles": 40}, "smoke": {"runs": 10, "cycles": 3}}
STEPS, EFFECTS = 10, 5


def define() -> None:
    from ledger import Connector, connector
    from sagas import Context, workflow

    @connector("bench.traced_noop")
    class Noop(Connector):
        idempotent = True

        def execute(self, payload: dict, *, key: str) -> dict:
            return {"id": key}

    @workflow("bench_traced", version=1)
    def bench_traced(ctx: Context, _input: dict) -> int:
        for i in range(STEPS):
            ctx.step("s", int, i)
            if i % 2:
                ctx.effect("e", "bench.traced_noop", {"i": i})
        return STEPS


def receiver() -> tuple[subprocess.Popen, str]:
    out = tempfile.mkstemp(prefix="bench-spans-", suffix=".jsonl")[1]
    log = Path(tempfile.mkstemp(prefix="bench-otlp-", suffix=".log")[1])
    with open(log, "wb") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "tests.sagas.otlp_receiver", out], cwd=common.ROOT,
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    common.wait_for(lambda: "listening on" in log.read_text(), 20)
    found = re.search(r"listening on (http://\S+)", log.read_text())
    if found is None:
        proc.kill()
        raise SystemExit(f"the OTLP receiver did not start: {log.read_text()}")
    return proc, found.group(1)


def batch(runs: int, provider: object = None) -> tuple[float, float]:
    """Seconds of wall time and of this process's CPU per run: ``runs`` runs started, then
    advanced (timed), and with ``provider`` its spans exported (timed too)."""
    from sagas import start
    from sagas.replay.engine import Outcome, advance

    ids = [start("bench_traced", {}).id for _ in range(runs)]
    wall, cpu = time.perf_counter(), time.process_time()
    for run_id in ids:
        assert advance(str(run_id), owner="bench") == Outcome.COMPLETED
    if provider is not None:
        provider.force_flush()  # type: ignore[attr-defined]
    return (time.perf_counter() - wall) / runs, (time.process_time() - cpu) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "full"]
    db = "saga_bench_tracing_smoke" if args.smoke else "saga_bench_tracing"
    redis = RedisServer()
    redis.start()
    common.setup_django(DATABASE_URL=common.BENCH_DB.rsplit("/", 1)[0] + "/" + db, REDIS_URL=redis.url(),
                        SAGAS_DISPATCH_LISTEN="0", SAGAS_DISPATCH_RQ_DELAY="0")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from sagas import tracing

    define()
    common.reset_state()
    proc, url = receiver()

    def traced() -> object:
        return tracing.start_exporting(OTLPSpanExporter(endpoint=url + "/v1/traces"), batch=True)

    try:
        batch(10)  # warm: connections, prepared statements, imports
        batch(10, traced())
        tracing.stop_exporting()
        figures: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        for _ in range(size["cycles"]):
            figures["off"].append(batch(size["runs"]))
            figures["on"].append(batch(size["runs"], traced()))
            tracing.stop_exporting()
            common.reset_state()
    finally:
        os.killpg(proc.pid, 9)
        redis.cleanup()
    wall = {v: common.median([w for w, _ in f]) for v, f in figures.items()}
    cpu = {v: common.median([c for _, c in f]) for v, f in figures.items()}
    wall_ratio = common.median([on[0] / off[0] for off, on in zip(figures["off"], figures["on"], strict=True)])
    cpu_ratio = common.median([on[1] / off[1] for off, on in zip(figures["off"], figures["on"], strict=True)])
    spans = 1 + STEPS + STEPS // 2
    common.print_table(
        f"Tracing, {size['cycles']} cycles of {size['runs']} runs off then on, each run {STEPS} steps and "
        f"{STEPS // 2} effects ({spans} spans), one thread (2 cores, noisy: read the ratios)",
        [
            ("figure", "off (median)", "on (median)", "on / off (median of the cycles' ratios)"),
            ("wall ms per run", f"{wall['off'] * 1000:.2f}", f"{wall['on'] * 1000:.2f}", f"{wall_ratio:.3f}"),
            ("CPU ms per run (this process)", f"{cpu['off'] * 1000:.2f}", f"{cpu['on'] * 1000:.2f}",
             f"{cpu_ratio:.3f}"),
            ("CPU us per span (medians' difference)", "", f"{(cpu['on'] - cpu['off']) / spans * 1e6:.0f}", ""),
        ],
    )


if __name__ == "__main__":
    main()

"""bench/flow.py --smoke: flow control on real workers against the real simulated providers.

150 runs burst against a provider and a connector both limited to 50/s; 40 runs through a
provider outage that opens and closes a circuit; a few A/B rounds of effects with and without
flow control's rows. It uses its own database (saga_bench_flow_smoke) and a private Redis
server (every database of the shared one is taken), never the tests' or a full run's. About
30 s here. The full run's targets (within 10 % of N / 50 s; under 5 % slower) are the full
run's business (bench/README.md); here what a user would notice: the provider never saw more
than its limit in a second, no run failed or was left UNKNOWN, and no call was let go while the
circuit was open but its trial.
"""

from __future__ import annotations

import re

import pytest

from tests.procs import BENCH_OWN, run_python


@pytest.mark.xdist_group(BENCH_OWN)  # saga_bench_flow_smoke and a private Redis server
def test_flow_control_keeps_the_provider_under_its_limit_and_the_circuit_sends_only_its_trial():
    done = run_python(["bench/flow.py", "--smoke"], timeout=150)
    output = done.stdout[-5000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    rows: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| **"):
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            rows.setdefault(cells[0], []).append(cells[1])

    # 1. the burst: under the provider's limit in every second, every run completed, no 429 storm.
    assert int(rows["provider executions, most in any 1-second window"][0]) <= 50, output
    assert int(rows["gate's dispatch marks, most in any 1-second window"][0]) <= 50, output
    burst_not_completed, circuit_not_completed = rows["runs not COMPLETED"]
    burst_unknown, circuit_unknown = rows["UNKNOWN effects"]
    assert (burst_not_completed, burst_unknown) == ("0", "0"), output
    assert int(rows["provider 429s (ProviderLimit.refused)"][0]) <= 10, output
    assert re.fullmatch(r"[\d.]+ s", rows["first start to last completion"][0]), output

    # 2. the circuit opened, let one trial through per half-open spell, and closed again.
    opened, half_open, closed = (int(n) for n in rows["circuit changes (open / half_open / closed)"][0].split(" / "))
    assert opened >= 1 and half_open >= 1 and closed >= 1, output
    # A call let go just before the opening committed may still be on its way (a breaker cannot
    # recall it); none may be let go once the open state is there to read.
    assert rows["... of them let go after the opening had committed"] == ["0"], output
    calls, periods = rows["calls while half-open / half-open periods"][0].split(" / ")
    assert calls == periods, output
    assert (circuit_not_completed, circuit_unknown) == ("0", "0"), output
    assert float(rows["provider recovered to circuit closed"][0].removesuffix(" s")) < 10, output

    # 3. the overhead rounds measured something, on the workers and in-process.
    for label in ("workers: with rows against without, slower by (medians)",
                  "in-process: with rows against without, slower by (medians)"):
        assert re.fullmatch(r"[+-][\d.]+ %", rows[label][0]), (label, output)
    assert "Circuit of bench.flow_mail, timeline" in done.stdout

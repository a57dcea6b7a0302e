"""bench/agents.py --smoke: one pydantic-ai agent under real SIGKILLs, plain, with DBOS, and ours.

It uses its own databases (saga_bench_agents_smoke, and saga_bench_agents_smoke_dbos for
DBOS) and Redis db 10, never the tests' or a full run's. The smoke run installs nothing: the
DBOS half runs where its virtualenv (.bench/agents-dbos) was made by `make bench-env` or a
full run, and is printed as not measured elsewhere (a fresh checkout, CI); plain and ours
run under real SIGKILLs either way. About 20 s without DBOS, 40 s with it.
"""

from __future__ import annotations

from bench.agents import venv_ready as dbos_venv_ready
from tests.procs import run_python


def test_it_kills_all_three_agents_and_ours_repeats_no_tool_loses_no_run_and_bills_no_turn_twice(tmp_path):
    chart = tmp_path / "agents.png"
    done = run_python(["bench/agents.py", "--smoke", "--png", str(chart)], timeout=600)
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and "0.20" in line}
    # columns: crash chance, model cost per run, model turns billed again, restarts per run,
    # duplicate tool executions, effects UNKNOWN, runs lost, wall time
    plain = rows["plain pydantic-ai, restarted from scratch"]
    dbos = rows["pydantic-ai + DBOS (durable_exec.dbos)"]
    ours = rows["ours (sagas.agents.run_agent)"]
    dbos_measured = not dbos[1].startswith("not measured")
    assert dbos_measured == dbos_venv_ready(), dbos  # left out where its virtualenv is absent, and only there
    if dbos_measured:
        assert float(dbos[3]) > 0, f"no DBOS process was killed: the smoke run proved nothing ({output})"
        assert float(ours[1]) <= float(dbos[1]), (ours, dbos)
    else:
        assert "make bench-env" in dbos[1], dbos  # says how to get it
    for variant in (plain, ours):
        assert float(variant[3]) > 0, f"no process was killed: the smoke run proved nothing ({output})"
    assert (ours[4], ours[5], ours[6]) == ("0", "0", "0"), ours  # no duplicate, nothing UNKNOWN, nothing lost
    assert float(ours[1]) == 8.0 and ours[2] == "0", ours  # four turns billed once each, through every crash
    assert float(plain[1]) > 8.0 and int(plain[4]) > 0, plain  # starting over pays and acts again
    assert "Targets: met" in done.stdout
    assert chart.stat().st_size > 10_000 and chart.read_bytes()[:4] == b"\x89PNG"

"""The API keeps its contract under generated traffic: schemathesis, as the API's users run it,
against daphne on the test database, with a fixed generation (deterministic), a bounded number of
examples per operation, every check (``--checks all``: server errors, undocumented statuses and
headers, schema-valid requests refused, schema-invalid ones accepted, answers that break their
schema, auth...) and the stateful phase (chains of calls along the links it infers). Any finding
fails the test, with schemathesis' report (each finding's curl) in the assertion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from api.models import ApiKey
from tests.api.conftest import http

# Per operation and phase: about 350 requests. The coverage phase (every schema boundary, ~2,000
# more requests, twice the time) is `make contract`, kept out of make test's ten minutes.
EXAMPLES = int(os.environ.get("SAGA_SCHEMATHESIS_EXAMPLES", "6"))
PHASES = os.environ.get("SAGA_SCHEMATHESIS_PHASES", "examples,fuzzing,stateful")


def test_schemathesis_finds_nothing(api_server, keys, tmp_path):
    # No 429s: every generated request reaches the API (the rate limit has tests of its own).
    ApiKey.objects.filter(name="operator").update(rate_per_minute=0)
    assert http(api_server.base, "GET", "/openapi.json").status == 200
    command = [
        str(Path(sys.executable).with_name("st")), "run", f"{api_server.base}/api/v1/openapi.json",
        "--checks", "all", "--phases", PHASES, "--generation-deterministic",
        "--max-examples", str(EXAMPLES), "-H", f"Authorization: Bearer {keys['operator']}",
        "--no-color", "--request-timeout", "30", "--output-sanitize", "false",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    report = done.stdout[-30000:] + done.stderr[-5000:]
    assert done.returncode == 0, report
    generated = re.search(r"(\d+) generated", done.stdout)
    assert generated and int(generated.group(1)) >= 250, report  # it really sent traffic
    print(generated.group(0), "test cases")
    assert re.search(r"Stateful.{0,80}?Scenarios:\s+[1-9]", done.stdout, re.S), report  # the phase ran

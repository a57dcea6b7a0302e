"""The agents guide's example (docs/guides/agents.md, "A complete example") runs as written: its workflow module, its ``start`` and
``approve`` lines, and its worker command with the ``SAGAS_MODEL_PRICES`` it shows, against the
real simulated providers. The code is read from the README at test time, so the two cannot drift."""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from demo.providers.selectors import executions
from sagas import reject
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.ledger.conftest import stack  # noqa: F401  (the providers process, and workers pointed at it)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "agents.md"
SECTION = "## A complete example"
MODULE_MARKER = "# support/workflows.py"
START_MARKER = "from sagas import start, approve"
LATER_MARKER = "# ... once the run is WAITING for the shipment:"


def section() -> str:
    text = README.read_text()
    assert text.count(f"\n{SECTION}\n") == 1, f"{README.name} has no single {SECTION!r} section"
    return text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", section(), re.S | re.M)


def block(language: str, first_line: str) -> str:
    found = [b for b in blocks(language) if b.startswith(first_line)]
    assert len(found) == 1, f"no single ```{language} block starting with {first_line!r} in {SECTION}"
    return found[0]


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The README's module written where its first line says (``support/workflows.py``) and
    imported, as the worker will import it through SAGAS_MODULES; its worker command's environment."""
    package = tmp_path / "support"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "workflows.py").write_text(block("python", MODULE_MARKER))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("support", "support.workflows"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("support.workflows")
    [command] = [line for line in block("sh", "").splitlines() if "sagas_worker" in line]
    words = shlex.split(command)
    env = dict(word.split("=", 1) for word in words[: words.index("python")])
    assert env["SAGAS_MODULES"] == "support.workflows" and "SAGAS_MODEL_PRICES" in env
    return tmp_path, env


def readme_worker(stack, example):  # noqa: F811
    path, env = example
    return stack.procs.worker("w1", env["SAGAS_MODULES"], DEMO_PROVIDERS_URL=stack.url, PYTHONPATH=str(path),
                              SAGAS_MODEL_PRICES=env["SAGAS_MODEL_PRICES"])


def run_lines() -> tuple[str, str]:
    """The README's start/approve block, split where it says to wait."""
    code = block("python", START_MARKER)
    assert LATER_MARKER in code
    first, later = code.split(LATER_MARKER, 1)
    return first, later


def wait_status(run_id, wanted: str, timeout: float = 60) -> WorkflowRun:
    run = WorkflowRun.objects.get(id=run_id)

    def reached():
        run.refresh_from_db()
        return run.status == wanted

    wait_until(reached, timeout, interval=0.1, what=f"run {run_id} to be {wanted}")
    return run


def test_it_runs_the_readme_agent_example_through_its_approval_to_completion(stack, example):  # noqa: F811
    bob = get_user_model().objects.create_user("bob", password="pw-bob")
    first, later = run_lines()
    scope: dict = {"bob": bob}
    exec(first, scope)  # noqa: S102  (the README's own lines)
    run = scope["run"]
    readme_worker(stack, example)

    run = wait_status(run.id, RunStatus.WAITING)
    assert executions("shipping", "create").count() == 0
    exec(later, scope)  # noqa: S102  approve(run_id=run.id, name="approve:send_replacement", user=bob, ...)
    run = wait_status(run.id, RunStatus.COMPLETED)

    shipment = executions("shipping", "create").get()
    assert shipment.request == {"order": "o-7", "address": {"street": "12 High Street", "city": "London"}}
    mail = executions("email", "send").get().request
    assert mail["to"] == "ada@example.com" and shipment.response["shipment_id"] in mail["body"]
    assert run.result == f"Replacement {shipment.response['shipment_id']} sent."
    names = list(JournalEntry.objects.filter(run=run, kind="step").order_by("seq").values_list("name", flat=True))
    assert names == ["support.model", "support.tool.order_details", "support.model#2", "support.model#3",
                     "support.model#4"]
    # Priced as the README's SAGAS_MODEL_PRICES says (2 and 8 usd per million tokens), charged once per turn.
    turns = JournalEntry.objects.filter(run=run, kind="step", name__startswith="support.model")
    tokens = [t.payload["value"]["usage"] for t in turns]
    expected = sum(Decimal(u["input_tokens"]) * 2 + Decimal(u["output_tokens"]) * 8 for u in tokens) / 1_000_000
    assert run.cost_used == expected > 0


def test_it_shows_the_model_a_rejected_replacement_and_ships_nothing(stack, example):  # noqa: F811
    bob = get_user_model().objects.create_user("bob", password="pw-bob")
    first, later = run_lines()
    scope: dict = {"bob": bob}
    exec(first, scope)  # noqa: S102
    run = scope["run"]
    readme_worker(stack, example)
    wait_status(run.id, RunStatus.WAITING)

    scope["reject"] = reject
    exec(later.replace("approve(", "reject("), scope)  # noqa: S102  the README's line, deciding no
    run = wait_status(run.id, RunStatus.COMPLETED)
    assert run.result == ("No replacement sent: approval 'approve:send_replacement' was rejected by bob: "
                          "customer verified")
    assert executions("shipping", "create").count() == 0 and executions("email", "send").count() == 0

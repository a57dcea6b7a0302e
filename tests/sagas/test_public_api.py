"""The public API (``sagas`` and ``ledger``, never their submodules), used the way an integrator
or a test author uses it: in-process against real PostgreSQL, this process being the worker
(``advance``)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

import ledger
import sagas
from ledger import (
    AlreadyResolved,
    Connector,
    InvalidResolution,
    Timeout,
    connector,
    resolve,
)
from sagas import (
    ActionNotAllowed,
    AlreadyDecided,
    ApprovalRejected,
    Context,
    FourEyesViolation,
    NotSerializable,
    RunFinished,
    RunStatus,
    StartConflict,
    StepFailed,
    WaitTimedOut,
    WorkflowNotRegistered,
    approvals,
    approve,
    cancel,
    compensate,
    compensation_preview,
    effects,
    get_run,
    reject,
    retry,
    signal,
    start,
    workflow,
)
from sagas.replay.engine import advance

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


# --- workflows and connectors of this module -------------------------------------------------


@connector("pa.charge")
class Charge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}"}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("pa.email")
class Email(Connector):
    """Neither lookup nor idempotent: a timeout leaves the effect UNKNOWN for a person."""

    def execute(self, payload, *, key):
        raise Timeout("the mail server did not answer")


@workflow("pa_order", version=1)
def pa_order(ctx: Context, order: dict) -> dict:
    charge = ctx.effect("charge", "pa.charge", {"order": order["id"]})
    decision = ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(hours=1))
    settled = ctx.wait_for("settled", timeout=timedelta(hours=1))
    return {"charge": charge["transaction_id"], "approved_by": decision["by"], "settled": settled}


def _refuse() -> None:
    raise ValueError("card declined")


@workflow("pa_catches", version=1)
def pa_catches(ctx: Context, spec: dict) -> dict:
    caught = []
    try:
        ctx.step("pay", _refuse)
    except StepFailed as exc:
        caught.append(f"StepFailed {exc.error_type}")
    try:
        ctx.wait_for("never", timeout=timedelta(0))
    except WaitTimedOut:
        caught.append("WaitTimedOut")
    try:
        ctx.approval("go", reason="Go?", timeout=timedelta(hours=1))
    except ApprovalRejected as exc:
        caught.append(f"ApprovalRejected {exc}")
    return {"caught": caught}


@workflow("pa_email", version=1)
def pa_email(ctx: Context, spec: dict) -> dict:
    return ctx.effect("email", "pa.email", {"to": spec["to"]})


def _one(i: int) -> int:
    return i


@workflow("pa_budget", version=1, max_steps=1)
def pa_budget(ctx: Context, spec: dict) -> list:
    return [ctx.step("s", _one, 1), ctx.step("s", _one, 2)]


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture
def people():
    model = get_user_model()
    return {name: model.objects.create_user(name, password=f"pw-{name}") for name in ("alice", "bob")}


def advanced(run) -> sagas.RunStatus:
    advance(str(run.id), owner="t")
    return get_run(run.id).status


def waiting_order(people, order: str = "o-1"):
    """pa_order started by alice, its charge done, waiting for approval "ship"."""
    run = start("pa_order", {"id": order}, business_key=order, started_by=people["alice"])
    assert advanced(run) == RunStatus.WAITING
    return run


# --- the names exist, are documented, and import cheaply ---------------------------------------


@pytest.mark.parametrize("package", [sagas, ledger], ids=["sagas", "ledger"])
def test_it_exports_every_public_name_with_its_own_docstring(package):
    for name in package.__all__:
        obj = getattr(package, name)
        doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
        assert doc and doc.strip(), f"{package.__name__}.{name} has no docstring of its own"
    assert package.__doc__ and "public API" in package.__doc__


def test_it_imports_both_packages_without_loading_django_models():
    """``import sagas, ledger`` works before Django is set up (a settings module, a CLI)."""
    code = (
        "import sys, sagas, ledger\n"
        "loaded = sorted(m for m in sys.modules if m.endswith('.models') and m.split('.')[0] in "
        "('sagas', 'ledger', 'django'))\n"
        "print(loaded, sagas.workflow.__name__, ledger.connector.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "[]", out.stdout


def test_it_shows_only_public_names_in_the_readme_the_tutorial_and_the_guides():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs" / "tutorial").glob("*.md")),
             *sorted((ROOT / "docs" / "guides").glob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    assert not re.findall(r"\b(?:sagas|ledger)\.(?!py\b)[a-z_]+\.[A-Za-z_]", readme)  # sagas.waits.x, ...
    assert not re.findall(r"from (?:sagas|ledger)\.[a-z_]+ import", readme)
    assert "console.services" not in readme
    imports = re.findall(r"from (sagas|ledger) import \(([\w,\s]+)\)", readme)
    imports += re.findall(r"from (sagas|ledger) import (\w[\w, ]*)$", readme, flags=re.MULTILINE)
    assert len(imports) >= 4, imports
    for package, names in imports:
        exported = {"sagas": sagas, "ledger": ledger}[package].__all__
        for name in names.split(","):
            assert name.strip() in exported, f"README imports {name.strip()} from {package}"
    extensions = {"testing"}  # the extension module a workflow author uses (docs/guides/testing.md)
    for name in re.findall(r"`sagas\.(\w+)", readme):
        assert name in sagas.__all__ or name in extensions, f"README names sagas.{name}"
    for name in re.findall(r"`ledger\.(\w+)", readme):
        assert name in ledger.__all__, f"README names ledger.{name}"


# --- the functions, end to end -----------------------------------------------------------------


def test_it_starts_approves_signals_and_finishes_a_run_reading_it_back(people):
    run = waiting_order(people)
    [charge] = effects(run.id)
    assert (charge.step_name, charge.connector, charge.status) == ("charge", "pa.charge", "SUCCEEDED")
    assert charge.result == {"transaction_id": "tx-o-1"}
    [ship] = approvals(run.id)
    assert (ship.step, ship.state, ship.reason) == ("ship", "PENDING", "Ship order o-1?")

    with pytest.raises(FourEyesViolation):  # alice started it
        approve(run_id=run.id, name="ship", user=people["alice"])
    decided = approve(run_id=run.id, name="ship", user=people["bob"], comment="looks right")
    assert (decided.state, decided.decided_by_label) == ("APPROVED", "bob")
    with pytest.raises(AlreadyDecided, match="already approved by bob"):
        reject(approval_id=ship.id, user=people["bob"])
    with pytest.raises(TypeError):
        approve(user=people["bob"], run_id=run.id)  # which approval?

    assert advanced(run) == RunStatus.WAITING  # now for the signal
    signal(run_id=run.id, name="settled", payload={"amount": 12})
    assert advanced(run) == RunStatus.COMPLETED
    finished = get_run(run.id)
    assert finished.result == {"charge": "tx-o-1", "approved_by": "bob", "settled": {"amount": 12}}
    assert [a.state for a in approvals(run.id)] == ["APPROVED"]
    with pytest.raises(RunFinished):
        signal(run_id=run.id, name="settled")
    assert get_run(uuid.uuid4()) is None and get_run("not-a-run") is None


def test_it_raises_the_exported_errors_inside_a_workflow(people):
    run = start("pa_catches", {}, started_by=people["alice"])
    assert advanced(run) == RunStatus.WAITING
    reject(run_id=run.id, name="go", user=people["bob"], comment="not today")
    assert advanced(run) == RunStatus.COMPLETED
    assert get_run(run.id).result == {
        "caught": ["StepFailed ValueError", "WaitTimedOut", "ApprovalRejected approval 'go' was rejected by bob: not today"]
    }


def test_it_refuses_a_conflicting_start_an_unknown_workflow_and_a_non_json_input():
    first = start("pa_budget", {"n": 1}, business_key="k-1")
    assert start("pa_budget", {"n": 1}, business_key="k-1").id == first.id  # idempotent
    with pytest.raises(StartConflict):
        start("pa_budget", {"n": 2}, business_key="k-1")
    with pytest.raises(WorkflowNotRegistered):
        start("pa_no_such_workflow")
    with pytest.raises(NotSerializable):
        start("pa_budget", {"n": {1, 2}})


def test_it_cancels_with_or_without_undoing_effects(people):
    kept = waiting_order(people, "o-keep")
    with pytest.raises(ActionNotAllowed):
        cancel(run_id=kept.id, reason=" ", compensate=False)
    cancelled = cancel(run_id=kept.id, reason="customer left", compensate=False, user=people["bob"])
    assert cancelled.status == RunStatus.CANCELLED
    assert [e.status for e in effects(kept.id)] == ["SUCCEEDED"]  # the charge stays
    assert [a.state for a in approvals(kept.id)] == ["EXPIRED"]
    with pytest.raises(RunFinished):
        cancel(run_id=kept.id, reason="again", compensate=False)

    undone = waiting_order(people, "o-undo")
    assert cancel(run_id=undone.id, reason="fraud", compensate=True).status == RunStatus.COMPENSATING
    assert advanced(undone) == RunStatus.COMPENSATED
    assert [(e.kind, e.status) for e in effects(undone.id)] == [("effect", "SUCCEEDED"), ("compensation", "SUCCEEDED")]


def test_it_previews_and_runs_a_compensation(people):
    run = waiting_order(people)
    [charge] = effects(run.id)
    [item] = compensation_preview(run_id=run.id)
    assert (item.step_name, item.reversible, item.compensation_key) == ("charge", True, f"{charge.idempotency_key}:compensate")
    with pytest.raises(ActionNotAllowed):
        compensate(run_id=run.id, reason="")
    assert compensate(run_id=run.id, reason="order withdrawn", user=people["bob"]).status == RunStatus.COMPENSATING
    assert advanced(run) == RunStatus.COMPENSATED
    undo = effects(run.id)[1]
    assert (undo.kind, undo.idempotency_key, undo.result) == (
        "compensation", f"{charge.idempotency_key}:compensate", {"refund_id": "rf-o-1"}
    )
    with pytest.raises(RunFinished):
        compensate(run_id=run.id, reason="again")


def test_it_retries_a_run_that_ran_out_of_budget():
    run = start("pa_budget", {})
    assert advanced(run) == RunStatus.NEEDS_ATTENTION
    assert get_run(run.id).status_reason == "budget_exceeded"
    assert retry(run_id=run.id, reason="one more step is fine").status == RunStatus.PENDING
    assert advanced(run) == RunStatus.COMPLETED
    assert get_run(run.id).result == [1, 2]
    with pytest.raises(ActionNotAllowed):
        retry(run_id=run.id, reason="again")


def test_it_resolves_an_unknown_effect_with_evidence_and_the_run_resumes(people):
    run = start("pa_email", {"to": "ann@example.com"})
    assert advanced(run) == RunStatus.NEEDS_ATTENTION
    [email] = effects(run.id)
    assert email.status == "UNKNOWN" and get_run(run.id).status_reason == "effect_unknown"
    with pytest.raises(InvalidResolution):  # succeeded needs the provider's reference
        resolve(effect_id=email.id, outcome="succeeded", note="in the outbox", user=people["bob"])
    resolved = resolve(effect_id=email.id, outcome="succeeded", downstream_ref="msg-77",
                       note="seen in the provider's outbox", user=people["bob"])
    assert (resolved.status, resolved.resolved_by_label, resolved.resolution_note) == (
        "SUCCEEDED", "bob", "seen in the provider's outbox"
    )
    assert get_run(run.id).status == RunStatus.PENDING  # it resumes by itself
    assert advanced(run) == RunStatus.COMPLETED
    assert get_run(run.id).result["downstream_ref"] == "msg-77"
    with pytest.raises(AlreadyResolved, match="already resolved by bob"):
        resolve(effect_id=email.id, outcome="failed", note="no", user=people["alice"])


def test_it_takes_keyword_arguments_only_in_every_action():
    """A call cannot mix up a run id and a reason, and cancel makes the caller choose."""
    for fn in (approve, reject, signal, cancel, compensate, retry, compensation_preview, resolve):
        params = inspect.signature(fn).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), fn.__name__
    assert "compensate" in inspect.signature(cancel).parameters
    assert inspect.signature(cancel).parameters["compensate"].default is inspect.Parameter.empty

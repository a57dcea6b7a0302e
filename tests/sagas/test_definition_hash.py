"""What a definition hash covers: the workflow's whole module, except the other workflows in it
and what cannot change behaviour (comments, docstrings, blank lines)."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import pytest

from sagas import DuplicateWorkflow, start
from sagas.models import RunStatus, WorkflowRun, WorkflowVersion
from sagas.versions import registry
from sagas.versions.definition_hash import definition_hash, definition_source
from tests.procs import wait_until

HERE = Path(__file__).resolve().parent


def test_it_gives_a_new_hash_when_only_a_helper_in_the_module_changed():
    from tests.sagas import wf_helper_a

    definition = registry.get("helper_edited", 1)
    assert "def _discount" in definition.source and "0.9" in definition.source  # recorded, for the diff
    edited = (HERE / "wf_helper_b.py").read_text()
    assert definition_hash(edited) != definition.definition_hash
    assert definition_hash((HERE / "wf_helper_a.py").read_text()) == definition.definition_hash
    # In one process, the edited module cannot pass for the same version.
    with pytest.raises(DuplicateWorkflow, match="helper_edited"):
        importlib.import_module("tests.sagas.wf_helper_b")
    assert registry.get("helper_edited", 1).fn is wf_helper_a.helper_edited


@pytest.mark.django_db(transaction=True)
def test_it_parks_a_run_rather_than_resume_it_on_a_module_whose_helper_changed(procs, step_calls):
    from tests.sagas import wf_helper_a  # noqa: F401

    run = start("helper_edited", {"cents": 1000})
    procs.worker("w_b", "tests.sagas.wf_helper_b")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.NEEDS_ATTENTION, 60,
               what="the run to be parked")
    run.refresh_from_db()
    assert run.status_reason == "version_mismatch"
    assert step_calls.counts(run.id) == {}  # nothing ran on the edited module
    sources = dict(WorkflowVersion.objects.filter(name="helper_edited").values_list("definition_hash", "source"))
    assert len(sources) == 2 and "0.8" in sources[run.error["live_hashes_for_version"][0]]

    procs.worker("w_a", "tests.sagas.wf_helper_a")  # the original module comes back: the run finishes
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 60,
               what="the run to finish on A")
    run.refresh_from_db()
    assert run.result == 900


def test_it_keeps_an_old_versions_hash_when_a_new_version_is_added_beside_it():
    from tests.sagas import wf_multi_new

    v2 = registry.get("multi", 2)
    assert v2.definition_hash != registry.get("multi", 3).definition_hash
    assert "multi_v3" not in v2.source and "multi_v2" in v2.source
    old = importlib.import_module("tests.sagas.wf_multi_old")  # v2 alone: the same hash, so no DuplicateWorkflow
    assert definition_hash(definition_source(old.multi_v2)) == v2.definition_hash
    assert registry.get("multi", 3).fn is wf_multi_new.multi_v3


MODULE = '''\
"""Orders, first deployment."""

from __future__ import annotations

import sagas
from sagas import workflow as wf

RATE = 3  # per cent

PROMPT = """Summarise the order.

Be brief."""


def fee(cents: int) -> int:
    """The fee on an order."""
    return cents * RATE // 100


@wf("{name}", version=1)
def flow(ctx, spec):
    return fee(spec["cents"])
'''


def load(tmp_path: Path, source: str, name: str):
    """Import ``source`` as a fresh module; returns its module object."""
    module_name = f"hashmod_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module_name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(str(tmp_path))


def test_it_ignores_comments_docstrings_and_blank_lines_but_not_strings_or_code(tmp_path):
    name = f"hash_{uuid.uuid4().hex[:8]}"
    base = MODULE.format(name=name)
    first = load(tmp_path, base, name)
    original = registry.get(name, 1).definition_hash
    assert registry.get(name, 1).fn is first.flow

    same = [
        base.replace('"""Orders, first deployment."""', '"""Orders, second deployment: reworded."""'),
        base.replace("# per cent", "# percent, rounded down"),
        base.replace('    """The fee on an order."""\n', ""),
        base.replace("\n\ndef fee", "\n\n\n# the fee\ndef fee").replace("RATE = 3", "RATE = 3   "),
        # A new version beside it, decorated as sagas.workflow: not part of version 1's hash.
        base + f'\n\n@sagas.workflow("{name}", version=2)\ndef flow2(ctx, spec):\n    return 0\n',
    ]
    for text in same:
        load(tmp_path, text, name)  # registering the same (name, version) again: accepted, same hash
        assert registry.get(name, 1).definition_hash == original, text

    different = [
        base.replace("RATE = 3", "RATE = 4"),
        base.replace("Summarise the order.\n\nBe brief.", "Summarise the order.\n\n\nBe brief."),  # inside a string
        base.replace("return cents * RATE // 100", "return cents * RATE // 100 + 1"),
        base.replace("import sagas\n", "import sagas\nimport json\n"),
    ]
    for text in different:
        with pytest.raises(DuplicateWorkflow):
            load(tmp_path, text, name)


def test_it_hashes_a_function_without_a_source_file_by_its_own_code():
    def made(body: str):
        namespace: dict = {}
        code = f"def flow(ctx, spec):\n    return {body}\n"
        exec(code, namespace)  # noqa: S102  (a function with no source file)
        return namespace["flow"]

    def hashed(fn) -> str:
        return definition_hash(definition_source(fn))

    assert hashed(made("spec")) == hashed(made("spec"))
    assert hashed(made("spec")) != hashed(made("[spec]"))


@pytest.mark.django_db(transaction=True)
def test_it_resumes_a_run_started_before_the_whole_module_hash_under_its_old_function_hash(step_calls):
    """Upgrading Saga Console changed how hashes are computed. A run in flight recorded the
    old one (the function's own source): it resumes while that source is unchanged, and a run
    with any other hash is still refused."""
    import hashlib

    from sagas.replay.engine import Outcome, advance
    from sagas.versions.definition_hash import function_source
    from tests.sagas import wf_helper_a

    definition = registry.get("helper_edited", 1)
    legacy = hashlib.sha256(function_source(wf_helper_a.helper_edited).encode("utf-8")).hexdigest()
    assert definition.legacy_hash == legacy != definition.definition_hash

    before_upgrade = start("helper_edited", {"cents": 1000})
    WorkflowRun.objects.filter(id=before_upgrade.id).update(definition_hash=legacy)
    assert advance(str(before_upgrade.id), owner="t") == Outcome.COMPLETED
    assert step_calls.counts(before_upgrade.id)  # its steps really ran, on the old hash

    foreign = start("helper_edited", {"cents": 1000}, business_key="foreign")
    WorkflowRun.objects.filter(id=foreign.id).update(definition_hash="0" * 64)
    assert advance(str(foreign.id), owner="t") == Outcome.NEEDS_ATTENTION
    foreign.refresh_from_db()
    assert foreign.status == RunStatus.NEEDS_ATTENTION and foreign.status_reason == "version_mismatch"

"""A connector or workflow name means one thing in a process: a second registration under a
name already taken stops the process at start-up, naming both modules. Before, connectors
silently replaced each other, and which one won depended on the order apps loaded in."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from ledger import Connector, ConnectorAlreadyRegistered, connector
from tests.procs import ROOT, run_python


def _check(tmp_path, settings_module: str, source: str) -> subprocess.CompletedProcess:
    """``manage.py check`` with ``source`` as the module ``extra_flows`` listed in SAGAS_MODULES."""
    (tmp_path / "extra_flows.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGAS_", "DJANGO_"))}
    env.update(DJANGO_SETTINGS_MODULE=settings_module, DEBUG="1", SAGAS_MODULES="extra_flows",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    return run_python(["manage.py", "check"], env=env, timeout=120)


CAPTURE = """
    from ledger import connector

    @connector("payments.capture")
    class MyCapture:
        idempotent = True

        def execute(self, payload, *, key):
            return {"id": key}
"""


def test_it_refuses_at_start_up_a_connector_name_the_demo_already_has_naming_both_modules(tmp_path):
    done = _check(tmp_path, "config.settings_demo", CAPTURE)
    assert done.returncode != 0, done.stdout
    assert "ConnectorAlreadyRegistered" in done.stderr
    assert ("connector 'payments.capture' is registered twice: by demo.connectors.CapturePayment "
            "and by extra_flows.MyCapture") in done.stderr, done.stderr[-2000:]


def test_it_starts_the_same_module_under_the_product_settings_where_the_demo_is_not_installed(tmp_path):
    done = _check(tmp_path, "config.settings", CAPTURE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "System check identified no issues" in done.stdout


def test_it_refuses_at_start_up_a_workflow_version_registered_twice_naming_both_modules(tmp_path):
    done = _check(tmp_path, "config.settings_demo", """
        from sagas import workflow

        @workflow("order_fulfilment", version=1)
        def mine(ctx, order):
            return {"ok": True}
    """)
    assert done.returncode != 0, done.stdout
    assert ("workflow 'order_fulfilment' version 1 is registered twice, with different definitions: "
            "from demo.workflows and from extra_flows") in done.stderr, done.stderr[-2000:]


def test_it_takes_the_same_class_imported_again_as_one_registration():
    class Once(Connector):
        def execute(self, payload, *, key):
            return {"id": key}

    connector("tests.unique.once")(Once)
    connector("tests.unique.once")(Once)  # a module imported again: the same class, no error

    other = type("Once", (Connector,), {"__module__": "somewhere.else", "execute": Once.execute})
    with pytest.raises(ConnectorAlreadyRegistered, match=r"by tests\.ledger\.test_unique_names\..*Once and by "
                                                        r"somewhere\.else\.Once"):
        connector("tests.unique.once")(other)

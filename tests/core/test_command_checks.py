"""The system checks a background process runs before it starts (core.commands.NoPageCommand)."""

from __future__ import annotations

from django.core.checks import Tags
from django.core.management import load_command_class

from core.commands import NoPageCommand


def test_a_worker_runs_every_check_but_the_url_check_and_manage_py_check_still_runs_that_one():
    worker = load_command_class("sagas", "sagas_worker")
    assert isinstance(worker, NoPageCommand)
    tags = worker.get_check_kwargs({})["tags"]
    # Models, security, templates and the admin are still checked before a worker takes a job;
    # only the check that imports the console's and the API's URL configuration is left out.
    assert Tags.urls not in tags
    assert {Tags.models, Tags.security, Tags.templates, Tags.admin} <= set(tags)
    check = load_command_class("django.core", "check")
    assert not isinstance(check, NoPageCommand)
    for app, name in (("sagas", "sagas_sweep"), ("ledger", "ledger_reconcile"), ("demo", "demo_providers")):
        assert isinstance(load_command_class(app, name), NoPageCommand), name

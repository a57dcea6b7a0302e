"""Indexes for the console's runs list (operators.selectors.runs.runs_page).

The list pages on ``(created_at desc, id desc)``; every equality filter gets an index that
leads with it and then carries that order, so a filtered page is a short index range scan
instead of "walk the newest runs until 50 match" (seconds for a workflow, version or tenant
whose runs are all old or rare) or "fetch every match and sort". The business-key index
uses ``varchar_pattern_ops`` so the prefix search (``LIKE 'key%'``) can use it whatever the
database collation; it serves exact matches too.

Built ``CONCURRENTLY`` (hence ``atomic = False``) so that adding them to a live table does
not block the engine's writes. They are SQL only and not declared in ``WorkflowRun.Meta``:
the model state is unchanged, so ``makemigrations`` stays clean.
"""

from __future__ import annotations

from django.db import migrations

INDEXES = {
    "run_status_created": "(status, created_at DESC, id DESC)",
    "run_workflow_created": "(workflow_name, created_at DESC, id DESC)",
    "run_workflow_version_created": "(workflow_name, version, created_at DESC, id DESC)",
    "run_tenant_created": "(tenant, created_at DESC, id DESC)",
    "run_business_key_prefix": "(business_key varchar_pattern_ops)",
}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sagas", "0005_run_finished_index")]

    operations = [
        migrations.RunSQL(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON sagas_workflowrun {columns}",
            f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
        )
        for name, columns in INDEXES.items()
    ]

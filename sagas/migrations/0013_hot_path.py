"""The dispatch and step hot path: one index fewer on the run row.

``run_updated`` (``updated_at`` alone) served no query: the console's pages (bench/console.py
on 200,000 runs: 0 scans), the notifications' "runs that changed lately", the overview and the
sweeper all filter on ``status`` too, and use ``run_status_updated``; with ``run_updated`` dropped
their plans are the same (EXPLAIN ANALYZE in the hot-path report). Every run writes each of its
indexes three times (the start's INSERT, and the claim's and the finish's UPDATEs, which change
indexed columns and so are never HOT).

Dropped ``CONCURRENTLY`` (hence ``atomic = False``) so that a live table's writers are not
blocked while it goes.
"""

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sagas", "0012_retention")]

    operations = [
        RemoveIndexConcurrently(model_name="workflowrun", name="run_updated"),
    ]

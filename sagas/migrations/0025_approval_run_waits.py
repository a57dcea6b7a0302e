"""``ApprovalRequest.run_waits``: whether the approval's run waits for a decision, kept by
triggers (``sagas.store.approval_waits``), and the partial index of the open approvals whose
run waits (``approval_waiting_deadline``), which the inbox and the overview read alone.

The column is added with a constant default in the database too (no table rewrite; a load that
turns the triggers off still inserts without naming it), the existing open approvals
are flagged from their runs in the same transaction as the triggers, then the index is built
``CONCURRENTLY`` (hence ``atomic = False``: each step commits on its own)."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from sagas.store import approval_waits


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0024_run_business_key_upper_prefix"),
    ]

    operations = [
        migrations.AddField(
            model_name="approvalrequest",
            name="run_waits",
            field=models.BooleanField(default=False, db_default=False, editable=False),
        ),
        migrations.RunSQL(approval_waits.INSTALL, approval_waits.UNINSTALL),
        AddIndexConcurrently(
            model_name="approvalrequest",
            index=models.Index(fields=["deadline", "id"], include=["requested_at"],
                               condition=models.Q(state__in=["PENDING", "ESCALATED"], run_waits=True),
                               name="approval_waiting_deadline"),
        ),
    ]

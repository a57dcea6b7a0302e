"""The partial index of open approvals in deadline order (``ApprovalRequest.Meta``:
``approval_open_deadline``): the inbox reads its first rows in order and stops, instead of
joining and sorting every open approval. Built ``CONCURRENTLY`` (hence ``atomic = False``)."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("sagas", "0022_run_attention_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="approvalrequest",
            index=models.Index(fields=["deadline", "id"], condition=models.Q(state__in=["PENDING", "ESCALATED"]),
                               name="approval_open_deadline"),
        ),
    ]

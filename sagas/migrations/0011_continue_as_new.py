"""Runs linked in a chain by ``ctx.continue_as_new``: both directions, plain ids (no FK)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sagas", "0010_run_summary_business_key_trigram")]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="continued_from",
            field=models.UUIDField(blank=True, null=True, help_text="the run this one continues"),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="continued_to",
            field=models.UUIDField(blank=True, null=True, help_text="the run that continues this one"),
        ),
    ]

"""The business-key search's index becomes one of every 3- and 4-character piece of the key
(``sagas.store.key_grams``) in place of the ``pg_trgm`` trigram index (0010): a term whose every
trigram is common (``KYC-0001``) read trigram lists as long as the table (30 ms at a million
runs, 50 ms at ten million) where its 4-character pieces are rare (3 ms).

Both indexes are built and dropped ``CONCURRENTLY`` (hence ``atomic = False``) so the engine's
writes go on meanwhile; the new one exists before the old one goes, so the search is served
throughout. The ``pg_trgm`` extension stays: dropping it could break what an installation made
with it.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations

from sagas.store.key_grams import DROP_GRAMS_SQL, GRAMS_SQL, KeyGrams


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("sagas", "0028_effect_run_context")]

    operations = [
        migrations.RunSQL(GRAMS_SQL, DROP_GRAMS_SQL),
        AddIndexConcurrently(
            model_name="workflowrun",
            index=GinIndex(KeyGrams("business_key"), name="run_business_key_grams"),
        ),
        RemoveIndexConcurrently(model_name="workflowrun", name="run_business_key_trgm"),
    ]

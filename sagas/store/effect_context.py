"""The workflow and business key of an effect's run, copied onto the effect record
(``EffectRecord.workflow_name``, ``business_key``) when it is inserted, so the ambiguous-effects
queue filters and searches the open effects on their own columns (and their partial index)
instead of looking up the run of each one: at 10,000,000 runs and 20,000 open effects those
look-ups were 66 ms of a business-key search and 102 ms of a workflow filter.

A trigger does it, before every insert, from the run's row: every writer gets it, the ledger's
intent commit as much as a repair's copy or a test's fixture, and no writer can put in a value
its run does not have. A run's workflow and business key never change after it is created, so
nothing needs to follow later updates. An effect whose run is not in the table (an archived
run's effect restored, a hand-made row) keeps what the writer gave. Loads that bypass triggers
(``session_replication_role = replica``, as ``bench/console.py`` does) set the columns
themselves.

The records of effects settled before the columns existed stay blank: the queue only ever
shows open effects, and those are filled when the trigger is installed (sagas migration 0028).
"""

from __future__ import annotations

from ledger.models import EffectRecord
from sagas.models import WorkflowRun

_RUNS = WorkflowRun._meta.db_table
_EFFECTS = EffectRecord._meta.db_table

INSTALL = f"""
CREATE OR REPLACE FUNCTION sagas_effect_run_context() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run_workflow text;
    run_key text;
BEGIN
    SELECT r.workflow_name, r.business_key INTO run_workflow, run_key FROM {_RUNS} r WHERE r.id = NEW.run_id;
    IF FOUND THEN
        NEW.workflow_name := run_workflow;
        NEW.business_key := run_key;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER sagas_effect_run_context BEFORE INSERT ON {_EFFECTS}
    FOR EACH ROW EXECUTE FUNCTION sagas_effect_run_context();

UPDATE {_EFFECTS} e SET workflow_name = r.workflow_name, business_key = r.business_key FROM {_RUNS} r
 WHERE r.id = e.run_id AND e.status NOT IN ('SUCCEEDED', 'FAILED_FINAL')
   AND (e.workflow_name, e.business_key) IS DISTINCT FROM (r.workflow_name, r.business_key);
"""

UNINSTALL = f"""
DROP TRIGGER IF EXISTS sagas_effect_run_context ON {_EFFECTS};
DROP FUNCTION IF EXISTS sagas_effect_run_context();
"""

"""Whether an approval's run waits for a decision, kept on the approval row itself
(``ApprovalRequest.run_waits``), so that the inbox and the overview read the open approvals
people can decide from one partial index instead of joining every open approval to its run.

An open approval (PENDING, ESCALATED) is in the inbox only while its run is WAITING or
NEEDS_ATTENTION: a run a worker holds right now (RUNNING), or one that went on without the
decision, does not ask anyone. At 10,000,000 runs and 30,000 open approvals that join was
76 ms of the inbox's SQL and 95 ms of the overview's.

Two triggers keep the flag exact, in the transaction that changes either side:

* before an approval is inserted or updated, its flag is read from its run's status (whatever
  the writer put there: a stale ``save()`` of an approval loaded before its run changed
  cannot write an old value back);
* after a run's status moves into or out of the waiting statuses, its approvals' flags are
  set again.

When a run's status change and a write to one of its approvals meet, the second to reach the
approval's row waits for the first to commit, and then its trigger reads the run again (each
statement in a trigger reads what is committed by then): whichever order, the flag ends as the
run's final status says. Loads that bypass triggers (``session_replication_role = replica``, as
``bench/console.py`` does) set the flag themselves.
"""

from __future__ import annotations

from sagas.models import ApprovalRequest, RunStatus, WorkflowRun

# Statuses of a run that waits for a person's decision on its open approvals.
WAITS_FOR_APPROVAL = (RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)

_RUNS = WorkflowRun._meta.db_table
_APPROVALS = ApprovalRequest._meta.db_table
_WAITING = ", ".join(f"'{s}'" for s in WAITS_FOR_APPROVAL)

INSTALL = f"""
CREATE OR REPLACE FUNCTION sagas_approval_run_waits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.run_waits := coalesce((SELECT r.status IN ({_WAITING}) FROM {_RUNS} r WHERE r.id = NEW.run_id), false);
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION sagas_run_waits_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {_APPROVALS} SET run_waits = (NEW.status IN ({_WAITING}))
     WHERE run_id = NEW.id AND run_waits IS DISTINCT FROM (NEW.status IN ({_WAITING}));
    RETURN NULL;
END $$;

CREATE TRIGGER sagas_approval_run_waits BEFORE INSERT OR UPDATE ON {_APPROVALS}
    FOR EACH ROW EXECUTE FUNCTION sagas_approval_run_waits();
CREATE TRIGGER sagas_run_waits_changed AFTER UPDATE OF status ON {_RUNS}
    FOR EACH ROW WHEN ((OLD.status IN ({_WAITING})) IS DISTINCT FROM (NEW.status IN ({_WAITING})))
    EXECUTE FUNCTION sagas_run_waits_changed();

UPDATE {_APPROVALS} a SET run_waits = true FROM {_RUNS} r
 WHERE r.id = a.run_id AND r.status IN ({_WAITING}) AND a.state IN ('PENDING', 'ESCALATED');
"""

UNINSTALL = f"""
DROP TRIGGER IF EXISTS sagas_run_waits_changed ON {_RUNS};
DROP TRIGGER IF EXISTS sagas_approval_run_waits ON {_APPROVALS};
DROP FUNCTION IF EXISTS sagas_run_waits_changed();
DROP FUNCTION IF EXISTS sagas_approval_run_waits();
"""

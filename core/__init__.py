"""The bottom layer every app shares: nothing here knows workflows, effects or pages.

* ``core.storage``: telling our own storage's failures (PostgreSQL, Redis) from a workflow's,
  back-off and one log line per outage;
* ``core.redaction``: hiding secrets in anything shown or exported;
* ``core.append_only``: the database triggers that keep the journal and the audit log
  append-only;
* ``core.commands``: the base of the long-running loop commands (sweeper, reconciler);
* ``core.redacted_admin``: the Django admin's read-only, redacted model pages.

It imports Django and the standard library only; ``ledger``, ``sagas``, ``console`` and
``api`` import it, never the reverse.
"""

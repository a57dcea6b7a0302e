"""Flow control per connector: shared limits, a circuit breaker and a pause, held in PostgreSQL.

Limits belong to the ledger, next to the connector they protect; the engine only sees "this
effect must wait" (``Journal.hold``). Every worker process on every host reads and writes the
same rows, so the limits hold across all of them, and a Redis flush or restart loses nothing.

* ``gate``: the check every dispatch passes, in the transaction that records it;
* ``pump``: lets held calls go, fairly and at the connector's rate, and wakes their runs;
* ``services``: declared defaults, and the live changes staff make (pause, resume, limits);
* ``selectors``: what the connectors page and the HTTP API show.

A call that flow control held back was never sent: its record is PENDING, never UNKNOWN.
"""

"""Schedules: workflows started on a calendar (a cron expression in a time zone, or a fixed
interval), each tick exactly once however many processes fire them.

* ``spec``: what a schedule says (``ScheduleSpec``, made by ``sagas.schedule``), its checks and
  its ticks (``cronsim`` for cron expressions, daylight-saving changes included);
* ``firing``: the sweeper's pass over due ticks (catch-up after downtime, overlap with the
  previous run, jitter), and firing one tick;
* ``services``: create, change, pause, resume, trigger, backfill, delete, and the sync of the
  schedules declared in ``@workflow(schedules=[...])``.

The tables are ``sagas.models.Schedule`` and ``ScheduleTick``. Nothing here imports a Django
model at import time but ``firing`` and ``services``, which need Django set up.
"""

"""Reads for the console pages, one module per page family: ``overview``, ``runs`` (the list and
a run's page), ``queues`` (ambiguous effects and approvals), ``versions`` and ``audit``; paged
lists all use ``paging``. Each returns plain data, model instances or QuerySets; views only
render them and never query the ORM themselves."""

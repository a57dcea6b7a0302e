"""Reads for the console's pages, one module per page family: ``overview``, ``history`` and
``conversation`` (a run's page), ``versions``, ``workers``, ``audit``, ``bulk``, ``decisions``
and ``payloads``. The reads the HTTP API shares (runs, queues, tenancy, paging, search) are in
``operators.selectors``. Each returns plain data, model instances or QuerySets; views only render
them and never query the ORM themselves."""

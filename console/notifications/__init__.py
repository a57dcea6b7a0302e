"""Notifications: outbound webhooks when something needs a person.

``models`` (endpoints, deliveries), ``detect`` (what needs a person, from the engine's signals
and the sweeper's pass), ``circuits`` (a connector's circuit opening or closing, from the
ledger's signal and the sweeper's pass), ``deliveries`` (creating one, and its run),
``workflows`` (``system.notify``, one run per delivery) and
``connectors`` (``webhook.post``, its one effect), ``signing`` (the Standard Webhooks headers),
``bodies`` (Slack-compatible and generic JSON), ``services`` and ``selectors`` (the staff
configuration and the deliveries page).
"""

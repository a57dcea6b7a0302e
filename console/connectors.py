"""The console's own connectors (found by ``ledger.connectors.autodiscover``): ``webhook.post``."""

from __future__ import annotations

from console.notifications import connectors  # noqa: F401  (registers webhook.post)

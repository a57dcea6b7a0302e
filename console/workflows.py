"""The console's own workflows (found by ``sagas.versions.registry.autodiscover``): ``system.notify``."""

from __future__ import annotations

from console.notifications import workflows  # noqa: F401  (registers system.notify)

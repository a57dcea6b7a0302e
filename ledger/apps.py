from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Side-effect ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from ledger import connectors

        connectors.autodiscover(list(getattr(settings, "LEDGER_MODULES", [])))

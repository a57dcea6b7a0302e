from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Side-effect ledger"
    default_auto_field = "django.db.models.BigAutoField"

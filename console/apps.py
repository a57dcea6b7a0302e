from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console import live  # noqa: F401  (connects engine signals to live pages)

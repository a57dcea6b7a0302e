from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console import broadcast  # noqa: F401  (installs live.broadcast, connects engine signals)
        from console.admin import apply_viewer_policy

        apply_viewer_policy()

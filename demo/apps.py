from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo workflows and simulated providers"
    default_auto_field = "django.db.models.BigAutoField"

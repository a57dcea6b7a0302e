from __future__ import annotations

from django.apps import AppConfig


class OperatorsConfig(AppConfig):
    name = "operators"
    verbose_name = "Operators: roles, tenants and audit"
    default_auto_field = "django.db.models.BigAutoField"

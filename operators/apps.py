from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class OperatorsConfig(AppConfig):
    name = "operators"
    verbose_name = "Operators: roles, tenants and audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(dual_control_check)


def dual_control_check(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """SAGA_DUAL_CONTROL names only known rules: a misspelt one would silently protect nothing."""
    from django.core.exceptions import ImproperlyConfigured

    from operators.services.dual_rules import rules

    try:
        rules()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="operators.E001")]
    return []

from __future__ import annotations

from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "sagas"
    verbose_name = "Sagas engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from sagas.versions import registry

        registry.autodiscover(list(settings.SAGAS_MODULES))
        from sagas import receivers  # noqa: F401  (connects ledger signals)

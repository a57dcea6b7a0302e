from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo workflows and simulated providers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The long agent loop (ctx.continue_as_new). In its own module, not imported from
        # demo.workflows: a new import there would change the hashes of that module's workflows
        # and strand their runs in flight.
        from demo import agent_loop  # noqa: F401

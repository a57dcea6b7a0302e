from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console import admin_users, auth_audit, system_audit, user_audit
        from console.admin import apply_viewer_policy
        from console.broadcast import connect_signals
        from console.notifications import admin as notifications_admin  # noqa: F401  (registers its models)
        from console.notifications.detect import connect_signals as connect_notifications
        from console.services.bulk import connect_signals as connect_bulk
        from console.services.sso import check_settings as check_sso_settings

        check_sso_settings()
        connect_signals()
        connect_bulk()
        connect_notifications()
        user_audit.connect_signals()
        auth_audit.connect_signals()
        system_audit.connect_signals()
        admin_users.register()
        apply_viewer_policy()

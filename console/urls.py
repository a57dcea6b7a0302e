"""URL map of the console, by page family (views in ``console/views/<family>.py``). Every action
is a POST with CSRF that goes through ``operators.services``."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from console.views import (
    api_keys,
    audit,
    bulk,
    connectors,
    notifications,
    overview,
    payloads,
    queues,
    run_actions,
    run_detail,
    run_history,
    run_list,
    schedules,
    sso,
    versions,
    workers,
)

app_name = "console"

urlpatterns = [
    # Signing in (console/views/sso.py): the password form and/or single sign-on (OpenID Connect).
    path("login/", sso.login, name="login"),
    path("login/break-glass/", sso.break_glass, name="login_break_glass"),
    path("oidc/authenticate/", sso.sso_start, name="sso_start"),
    path("oidc/callback/", sso.sso_callback, name="sso_callback"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", overview.overview, name="overview"),
    # Runs: the list, a run's page and its history; the actions (GET compensate/ previews the plan).
    path("runs/", run_list.runs_list, name="runs"),
    path("runs/<uuid:run_id>/", run_detail.run_detail, name="run"),
    path("runs/<uuid:run_id>/history/", run_history.run_history, name="run_history"),
    path("runs/<uuid:run_id>/history.json", run_history.run_history_json, name="run_history_json"),
    path("runs/<uuid:run_id>/cancel/", run_actions.run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/retry/", run_actions.run_retry, name="run_retry"),
    path("runs/<uuid:run_id>/compensate/", run_actions.run_compensate, name="run_compensate"),
    path("runs/<uuid:run_id>/pause/", run_actions.run_pause, name="run_pause"),
    path("runs/<uuid:run_id>/resume/", run_actions.run_resume, name="run_resume"),
    path("runs/<uuid:run_id>/move/", run_actions.run_move, name="run_move"),
    path("runs/<uuid:run_id>/redrive/", run_actions.run_redrive, name="run_redrive"),
    path("runs/<uuid:run_id>/fork/", run_actions.run_fork, name="run_fork"),
    # One stored value in full, behind a page's truncated preview (console/views/payloads.py).
    path("runs/<uuid:run_id>/payload/<str:kind>/", payloads.run_payload, name="run_payload"),
    path("runs/<uuid:run_id>/payload/<str:kind>/<int:item_id>/", payloads.run_payload, name="run_item_payload"),
    path("audit/<int:entry_id>/payload/<str:kind>/", payloads.audit_payload, name="audit_payload"),
    # The queues: ambiguous effects and the approvals inbox.
    path("effects/", queues.effects, name="effects"),
    path("effects/<int:effect_id>/query/", queues.effect_query, name="effect_query"),
    path("effects/<int:effect_id>/resolve/", queues.effect_resolve, name="effect_resolve"),
    path("approvals/", queues.approvals, name="approvals"),
    path("approvals/<int:approval_id>/decide/", queues.approval_decide, name="approval_decide"),
    # Dual control: requests waiting for a second person, shown in the approvals inbox.
    path("dual/<int:request_id>/confirm/", queues.dual_confirm_view, name="dual_confirm"),
    path("dual/<int:request_id>/refuse/", queues.dual_refuse_view, name="dual_refuse"),
    path("dual/<int:request_id>/withdraw/", queues.dual_withdraw_view, name="dual_withdraw"),
    # Versions.
    path("versions/", versions.versions, name="versions"),
    path("versions/diff/", versions.version_diff, name="version_diff"),
    path("versions/check/", versions.version_check, name="version_check"),
    # A workflow's pause (the workflow's name is a form field: names may hold any character).
    path("versions/pause/", versions.workflow_pause, name="workflow_pause"),
    path("versions/resume/", versions.workflow_resume, name="workflow_resume"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("schedules/<str:name>/", schedules.schedule_detail, name="schedule"),
    path("schedules/<str:name>/pause/", schedules.schedule_pause, name="schedule_pause"),
    path("schedules/<str:name>/resume/", schedules.schedule_resume, name="schedule_resume"),
    path("schedules/<str:name>/trigger/", schedules.schedule_trigger, name="schedule_trigger"),
    path("schedules/<str:name>/backfill/", schedules.schedule_backfill, name="schedule_backfill"),
    path("schedules/<str:name>/delete/", schedules.schedule_delete, name="schedule_delete"),
    path("workers/", workers.workers, name="workers"),
    # Flow control per connector: the page, and its actions (the connector's name is a form field).
    path("connectors/", connectors.connectors, name="connectors"),
    path("connectors/pause/", connectors.connector_pause, name="connector_pause"),
    path("connectors/resume/", connectors.connector_resume, name="connector_resume"),
    path("connectors/limits/", connectors.connector_limits, name="connector_limits"),
    # The audit log (read-only: no path changes an entry).
    path("audit/", audit.audit_log, name="audit"),
    path("audit.csv", audit.audit_csv, name="audit_csv"),
    # Bulk actions: the list pages post a selection or their filters; a batch's page is its preview
    # until confirmed, then its live progress.
    path("bulk/", bulk.bulk_batches, name="bulk_batches"),
    path("bulk/preview/", bulk.bulk_preview, name="bulk_preview"),
    path("bulk/<uuid:token>/", bulk.bulk_batch, name="bulk_batch"),
    path("bulk/<uuid:token>/confirm/", bulk.bulk_confirm, name="bulk_confirm"),
    # Notifications: the deliveries (any role), the webhook endpoints (staff).
    path("notifications/", notifications.deliveries, name="notifications"),
    path("notifications/endpoints/", notifications.endpoints, name="notification_endpoints"),
    path("notifications/endpoints/<int:endpoint_id>/", notifications.endpoint, name="notification_endpoint"),
    path("notifications/endpoints/<int:endpoint_id>/rotate/", notifications.endpoint_rotate,
         name="notification_endpoint_rotate"),
    # The HTTP API's keys (staff): list, expire now, revoke; and its webhooks in (read-only).
    path("api-keys/", api_keys.api_keys, name="api_keys"),
    path("api-keys/<int:key_id>/expire/", api_keys.api_key_expire, name="api_key_expire"),
    path("api-keys/<int:key_id>/revoke/", api_keys.api_key_revoke, name="api_key_revoke"),
]

"""Ambiguous effects, approvals inbox and versions (console/views/queues.py)."""

from __future__ import annotations

from django.urls import path

from console.views import queues

urlpatterns = [
    path("effects/", queues.effects, name="effects"),
    path("effects/<int:effect_id>/query/", queues.effect_query, name="effect_query"),
    path("effects/<int:effect_id>/resolve/", queues.effect_resolve, name="effect_resolve"),
    path("approvals/", queues.approvals, name="approvals"),
    path("approvals/<int:approval_id>/decide/", queues.approval_decide, name="approval_decide"),
    path("versions/", queues.versions, name="versions"),
    path("versions/diff/", queues.version_diff, name="version_diff"),
]

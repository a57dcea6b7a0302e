"""Websocket routes of the console (wrapped with auth and origin checks in config/asgi.py)."""

from __future__ import annotations

from django.urls import path

from console.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
]

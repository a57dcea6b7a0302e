"""ASGI entry point (daphne): Django for HTTP, the console's live pages for websockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Under ASGI each request's sync code runs in a thread of its own, and a persistent connection
# belongs to that thread: kept open (CONN_MAX_AGE > 0) it is never reused nor closed, so the web
# process leaked a PostgreSQL connection every few requests. As Django's docs advise for async
# mode: no persistent connections, a pool instead (config/settings.py DB_POOL_SIZE; 0 turns it off).
os.environ.setdefault("DB_CONN_MAX_AGE", "0")
os.environ.setdefault("DB_POOL_SIZE", "10")
django_asgi_app = get_asgi_application()

# These need the apps loaded.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

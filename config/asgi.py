"""ASGI entry point (daphne): Django for HTTP, the console's live pages for websockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Under ASGI each request's sync code runs in a thread of its own, and a persistent connection
# belongs to that thread: kept open (CONN_MAX_AGE > 0) it is never reused nor closed, so the web
# process leaked a PostgreSQL connection every few requests. As Django's docs advise for async
# mode: no persistent connections, a pool instead (config/settings.py DB_POOL_SIZE; 0 turns it off).
# Set only while the settings are read, never left in the environment: a process that imports this
# module (a test using the ASGI app) must not hand a pool to the workers and benches it starts,
# whose forked children would share the pool's open connections.
_WEB_DEFAULTS = {"DB_CONN_MAX_AGE": "0", "DB_POOL_SIZE": "10"}
_added = [name for name in _WEB_DEFAULTS if name not in os.environ]
os.environ.update({name: _WEB_DEFAULTS[name] for name in _added})
try:
    django_asgi_app = get_asgi_application()
finally:
    for _name in _added:
        os.environ.pop(_name, None)

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

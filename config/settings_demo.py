"""Settings for ``make demo`` and the test suite: the product's settings plus the ``demo`` app.

The demo (example workflows, the simulated payment, stock, shipping, email and model
providers, and the load generator) is never part of a deployment: ``config.settings`` does
not install it. Everything demo-only is set here.

Variables: DEMO_PROVIDERS_URL, DEMO_PROVIDER_TIMEOUT, DEMO_WEBHOOK_SECRET, and all of
``config.settings``'s.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from config.env import env_float, env_prices, env_str
from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS
from core.webhooks import is_standard_secret

INSTALLED_APPS = [*INSTALLED_APPS, "demo"]

# Where the demo connectors reach the simulated providers (manage.py demo_providers).
DEMO_PROVIDERS_URL = env_str("DEMO_PROVIDERS_URL", "http://127.0.0.1:8765")
# Seconds a demo connector waits for a provider's answer before raising Timeout.
DEMO_PROVIDER_TIMEOUT = env_float("DEMO_PROVIDER_TIMEOUT", 2.0, minimum=0.1)
# The secret the demo's webhook receiver checks signatures with (demo/providers/webhook.py):
# Standard Webhooks' form, whsec_ and base64 (here of "demo receiver, not a real secret!").
DEMO_WEBHOOK_SECRET = env_str("DEMO_WEBHOOK_SECRET", "whsec_ZGVtbyByZWNlaXZlciwgbm90IGEgcmVhbCBzZWNyZXQh")
if not is_standard_secret(DEMO_WEBHOOK_SECRET):
    raise ImproperlyConfigured("DEMO_WEBHOOK_SECRET must be a Standard Webhooks secret: whsec_ and the base64 of "
                               "24 to 64 bytes")
# The demo's simulated model has a price, so its agent runs show a cost against their budget.
SAGAS_MODEL_PRICES = env_prices("SAGAS_MODEL_PRICES", {"demo-order-model": (2.0, 8.0)})

"""Placeholder until the settings change lands: the product's settings plus the demo app."""

from config.settings import *  # noqa: F403

if "demo" not in INSTALLED_APPS:  # noqa: F405  (config/settings.py still installs it today)
    INSTALLED_APPS = [*INSTALLED_APPS, "demo"]  # noqa: F405

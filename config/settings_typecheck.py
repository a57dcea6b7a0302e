"""Settings for the type checker (mypy's django-stubs plugin, ``[tool.django-stubs]`` in
pyproject.toml): the demo's settings, with DEBUG on so that no production secret is needed.

Importing them touches neither the database nor Redis.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")

from config.settings_demo import *  # noqa: F403

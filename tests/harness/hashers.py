"""A quick password hasher for the test process.

Django's PBKDF2 runs a million iterations by design, about half a second per password on
this machine, and the suite creates users in hundreds of tests. This is the same algorithm
(``pbkdf2_sha256``) with few iterations: its hashes name their iteration count, so every
other process of the tests (daphne, workers, on the product's hashers) still verifies them.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000

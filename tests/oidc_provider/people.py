"""What the provider is seeded with, and the tests know: its users (username, groups at the
provider) and the console's client. No Django import: the test process reads it too."""

from __future__ import annotations

PASSWORD = "provider-pass-9173"
CLIENT_ID = "saga-console"
CLIENT_SECRET = "saga-console-secret-not-a-real-one"

# username -> groups at the provider. A group "tenant:<name>" is emitted in the "tenants" claim
# (as <name>), every other group in the "groups" claim.
USERS: dict[str, list[str]] = {
    "alice": ["ops-approvers", "ops-staff", "tenant:acme"],
    "bob": ["ops-staff", "tenant:globex"],
    "carol": ["auditors"],
}

"""Operator actions: each role-checked, locked, compared with what the person saw and audited in
the same transaction. ``actions`` holds that frame; ``runs`` and ``queues`` the actions on runs,
ambiguous effects and approvals; ``tenancy`` the tenant check; ``limits`` the length limits."""

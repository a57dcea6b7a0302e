"""The console's writes: operator actions, each role-checked, locked, compared with what the
person saw and audited in the same transaction. ``actions`` holds that frame; ``runs`` and
``queues`` the actions of each page family."""

"""Reads the console and the HTTP API share: runs (the list and one run), the queues (ambiguous
effects and approvals), tenant scoping, search, and keyset paging."""

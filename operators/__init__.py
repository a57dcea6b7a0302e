"""What an operator may do, through the console or the HTTP API: roles, tenant limits, the
audit log, and the actions themselves (each role-checked, locked, compared with what the person
saw, and audited in the same transaction), with the reads both front ends share. ``console``
(the web pages) and ``api`` (the HTTP API) both import this package; it imports neither."""

"""A client process that starts runs on the private servers, as a web process would.

Run as ``python -m tests.faults.driver`` with DATABASE_URL and REDIS_URL pointing at
the private servers. Reads one JSON request per line on stdin,
``{"workflow": name, "input": ...}``, calls ``sagas.start`` and answers one line on
stdout: ``@@`` then ``{"ok": true, "run_id": ..., "seconds": ...}`` or
``{"ok": false, "error": "<type>: <message>", "seconds": ...}``. Like a web request,
each call starts with ``close_old_connections()``.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import django

    django.setup()
    from django.db import close_old_connections

    from sagas import start

    out = sys.stdout
    out.write("@@" + json.dumps({"ok": True, "ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        began = time.monotonic()
        try:
            close_old_connections()
            run = start(request["workflow"], request.get("input"))
            answer = {"ok": True, "run_id": str(run.id)}
        except Exception as exc:  # reported to the test, which decides
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        answer["seconds"] = round(time.monotonic() - began, 3)
        out.write("@@" + json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

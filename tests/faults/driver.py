"""A client process that starts runs on the private servers, as a web process would.

Run as ``python -m tests.faults.driver`` with DATABASE_URL and REDIS_URL pointing at
the private servers. Reads one JSON request per line on stdin,
``{"workflow": name, "input": ...}``, calls ``sagas.start`` and answers one line on
stdout: ``@@`` then ``{"ok": true, "run_id": ..., "seconds": ...}`` or
``{"ok": false, "error": "<type>: <message>", "seconds": ...}``. Like a web request,
each call starts with ``close_old_connections()``. With ``"business_key"``, the start is
idempotent (``sagas.start``): a client that got an error sends it again.

``{"workflow": name, "inputs": [...], "business_keys": [...], "retry_for": seconds}`` starts
many, as a client that retries each failed start with the same business key until
``retry_for`` has passed: ``{"ok": true, "run_ids": [...], "errors": [<each failed attempt>]}``.
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
        if "inputs" in request:
            answer = start_many(start, close_old_connections, request)
        else:
            try:
                close_old_connections()
                run = start(request["workflow"], request.get("input"), business_key=request.get("business_key", ""))
                answer = {"ok": True, "run_id": str(run.id)}
            except Exception as exc:  # reported to the test, which decides
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        answer["seconds"] = round(time.monotonic() - began, 3)
        out.write("@@" + json.dumps(answer) + "\n")
        out.flush()


def start_many(start, close_old_connections, request: dict) -> dict:
    run_ids, errors = [], []
    for value, key in zip(request["inputs"], request["business_keys"]):
        deadline = time.monotonic() + request.get("retry_for", 60)
        while True:
            try:
                close_old_connections()
                run_ids.append(str(start(request["workflow"], value, business_key=key).id))
                break
            except Exception as exc:  # a client sees the error, and sends the same start again
                errors.append(f"{key}: {type(exc).__name__}: {exc}"[:300])
                if time.monotonic() > deadline:
                    return {"ok": False, "run_ids": run_ids, "errors": errors}
                time.sleep(0.2)
    return {"ok": True, "run_ids": run_ids, "errors": errors}


if __name__ == "__main__":
    main()

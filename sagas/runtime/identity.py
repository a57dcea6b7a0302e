"""Who a worker is: the name it writes into leases and the journal (``worker_id``).

A process is ``host:pid`` unless named (``sagas_worker --name``); a worker thread of a
process that runs several has its own name. A forked child never inherits its parent's.
"""

from __future__ import annotations

import os
import socket
import threading

_worker_id: tuple[int, str] | None = None
_thread_worker_id = threading.local()


def worker_id() -> str:
    """The identity written into leases and the journal by the calling thread.

    A worker thread of a process that runs several (``sagas_worker --concurrency N``)
    has its own, set with ``set_thread_worker_id``; every other thread uses the
    process's: ``host:pid`` unless named with ``set_worker_id``.
    """
    own = getattr(_thread_worker_id, "value", None)
    if own is not None and own[0] == os.getpid():
        return own[1]
    global _worker_id
    if _worker_id is None or _worker_id[0] != os.getpid():
        _worker_id = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}")
    return _worker_id[1]


def set_worker_id(name: str) -> None:
    """Name this process (every thread without its own name)."""
    global _worker_id
    _worker_id = (os.getpid(), name)


def set_thread_worker_id(name: str | None) -> None:
    """Name the calling thread only; ``None`` gives it the process's name back."""
    _thread_worker_id.value = None if name is None else (os.getpid(), name)

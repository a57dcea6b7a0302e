"""How long a PostgreSQL connection may go unanswered at the TCP level before it is dropped.

A host that loses the network (a pulled cable, a failed switch port, a partition, a machine that
powers off) sends nothing more: no FIN, no RST. Left to the operating system's defaults, each end
of its connections keeps them open: the server for about 2 h 11 min (keepalive after 2 h idle,
then 9 probes 75 s apart), holding the session's locks meanwhile (the sweeper's session advisory
lock, a run's row locked by an open transaction), and the client for up to 15 minutes of
retransmissions, or forever when it waits for an answer the server has already sent.

``DB_TCP_TIMEOUT`` (seconds) bounds both: TCP keepalives and ``tcp_user_timeout`` on the client
(libpq's connection parameters) and on the server (the same settings sent as ``options`` at
connection start, which any role may set for its own session). Data unacknowledged for that long,
or an idle connection whose probes go unanswered for that long, ends the connection; a slow query
does not (the kernel acknowledges probes and data, not the database). 0: the OS defaults.
"""

from __future__ import annotations

from typing import Any

PROBES = 3


def tcp_timeout_options(seconds: float) -> tuple[dict[str, Any], list[str]]:
    """(libpq connection parameters, server settings as ``-c name=value``) that drop a connection
    whose other end has not answered for about ``seconds``: keepalives from ``seconds / 2`` of
    silence, ``PROBES`` probes ``seconds / 6`` apart, and ``tcp_user_timeout`` of ``seconds``.
    Nothing for 0."""
    if seconds <= 0:
        return {}, []
    idle = max(1, round(seconds / 2))
    interval = max(1, round(seconds / (2 * PROBES)))
    user_timeout_ms = max(1000, round(seconds * 1000))
    client = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": PROBES,
        "tcp_user_timeout": user_timeout_ms,
    }
    server = [
        f"-c tcp_keepalives_idle={idle}",
        f"-c tcp_keepalives_interval={interval}",
        f"-c tcp_keepalives_count={PROBES}",
        f"-c tcp_user_timeout={user_timeout_ms}",
    ]
    return client, server

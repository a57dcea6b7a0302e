"""The live-pages websocket: ``/ws/live/?fragments=a,b&run=<uuid>&...``.

A page opens one socket listing its live fragments (console/live.py) and the params
they render with. The consumer joins the channel-layer groups of the topics those
fragments follow (console/topics.py) and, when an event arrives on one of them, re-renders
the fragments that follow that topic from PostgreSQL and sends the HTML; htmx-ext-ws swaps
each top-level element into the page by its id (``live-<name>``).

Contract:

* only authenticated users with a console role connect (others are refused before the
  handshake completes), and a page about a run outside the user's tenants
  (operators/selectors/tenancy.py) is refused too;
* access is checked again before every push and whenever the user's account changes (the
  ``user.<id>`` topic, published by console/user_audit.py: password, active flag, roles,
  tenants): a user whose password changed since the session was made (Django's session
  auth hash), who was deactivated or logged out is disconnected with code 4401; one whose
  console role was removed, or whose tenants no longer include the page's run, with 4403.
  Either way nothing more is pushed to that socket;
* unknown fragment names are ignored; a malformed ``run`` param or no known fragment
  refuses the connection;
* pushes are coalesced: at most one per ``PUSH_INTERVAL`` per connection, and a change
  that arrives while a push is being rendered is followed by another push, so the last
  change is never dropped. A new connection (also a reconnect) gets one push of every
  fragment at once, so nothing that changed while it was down is missed;
* when Redis (the channel layer) or PostgreSQL is unreachable, at connect, on a push or
  while the socket is open, the socket is closed (or refused before the handshake), so the page says it is
  reconnecting and retries; the process logs one line when the
  outage starts and one when a socket connects again, not a traceback per socket.

The ORM is reached only through ``database_sync_to_async``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import HASH_SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

from console import live
from console.topics import group_for, user_topic
from core.storage import OUTAGES, REDIS, is_storage_error, note_failure
from operators import roles
from operators.selectors.tenancy import may_see
from sagas.models import WorkflowRun

log = logging.getLogger("console.live")

PUSH_INTERVAL = 0.25  # seconds between two pushes on one connection
# channels_redis drops group members after its group_expiry (a day by default); an open
# page joins its groups again this often so it keeps hearing about changes.
REJOIN_INTERVAL = 3600.0
MAX_FRAGMENTS = 12
MAX_PARAMS = 20
MAX_PARAM_LENGTH = 500
CLOSE_FORBIDDEN = 4403  # not in htmx-ext-ws's reconnect list: the page stops retrying
CLOSE_SESSION_ENDED = 4401  # password changed, deactivated or logged out: the page stops retrying too
# Redis is away: the page should retry. 1011-1013 would say so, but daphne (autobahn) lets
# an application close only with 1000 or 3000-4999, and console.js reconnects after 1000.
CLOSE_RETRY = 1000

_PARAM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

class BadRequest(ValueError):
    pass


def parse_query(query_string: bytes, known: set[str]) -> tuple[list[str], dict[str, str]]:
    """``(fragments, params)`` from the socket's query string; raises ``BadRequest``."""
    try:
        query = parse_qs(query_string.decode("utf-8"), keep_blank_values=False, max_num_fields=MAX_PARAMS + 1)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"malformed query string: {exc}") from None
    names: list[str] = []
    for value in query.pop("fragments", []):
        for name in value.split(","):
            name = name.strip()
            if name in known and name not in names:
                names.append(name)
    if not names:
        raise BadRequest("no known fragment requested")
    if len(names) > MAX_FRAGMENTS:
        raise BadRequest("too many fragments")
    params: dict[str, str] = {}
    for key, values in query.items():
        value = values[0]
        if not _PARAM_NAME.match(key) or len(value) > MAX_PARAM_LENGTH:
            continue  # a param no fragment could use
        params[key] = value
    if "run" in params:
        try:
            params["run"] = str(uuid.UUID(params["run"]))
        except ValueError:
            raise BadRequest("run is not a run id") from None
    return names, params


def _session_current(user: Any, session: Any) -> bool:
    """The session still logs ``user`` in: it exists, and its auth hash is the user's (a
    password change makes a new hash; ``SECRET_KEY_FALLBACKS`` hashes are accepted, as
    Django's own check does)."""
    if session is None:
        return True
    if session.session_key and not session.exists(session.session_key):
        return False  # logged out (or the session expired) since the socket opened
    held = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return bool(held) and any(constant_time_compare(held, h) for h in hashes)


@database_sync_to_async
def _access(user_pk: Any, session: Any, run_id: str | None, tenant: str | None) -> tuple[Any, int, str | None]:
    """``(the user fresh from the database, 0, the run's tenant)`` if they may still see the
    page; else ``(None, the close code, tenant)``. ``tenant``: the page's run's, if already
    known (a run's tenant never changes, so each push need not read it again)."""
    user = get_user_model().objects.filter(pk=user_pk, is_active=True).first()
    if user is None or not _session_current(user, session):
        return None, CLOSE_SESSION_ENDED, tenant
    if not roles.can_view(user):
        return None, CLOSE_FORBIDDEN, tenant
    if run_id and tenant is None:
        tenant = WorkflowRun.objects.filter(id=run_id).values_list("tenant", flat=True).first()
    if tenant is not None and not may_see(user, tenant):
        return None, CLOSE_FORBIDDEN, tenant  # as if there were no such run: the fragments render nothing of it
    return user, 0, tenant


class LiveConsumer(AsyncWebsocketConsumer):
    _flusher: asyncio.Task[None] | None = None
    _rejoiner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # The channel layer's receive loop runs outside any handler: when Redis goes away it
        # raises here, and daphne would log a traceback per socket (and per reconnect attempt)
        # and leave this consumer's tasks running.
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            note_failure(exc, doing="serving live pages; open pages say 'reconnecting' and retry")
            # Before the handshake this refuses the socket; after it, it closes it. Either
            # way the page retries (console/static/console/console.js) with backoff.
            await send({"type": "websocket.close", "code": CLOSE_RETRY})
        finally:
            self._stop_tasks()

    def _stop_tasks(self) -> None:
        for task in (self._flusher, self._rejoiner):
            if task is not None:
                task.cancel()

    async def connect(self) -> None:
        self.live_groups: list[str] = []
        self._dirty: set[str] = set()
        self._last_push = float("-inf")
        self._revoked = False
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        try:
            self.fragments, self.params = parse_query(self.scope.get("query_string", b""), set(live.FRAGMENTS))
        except BadRequest as exc:
            log.info("live socket refused for %s: %s", user.get_username(), exc)
            await self.close()
            return
        self._run_tenant: str | None = None
        self.user, _, self._run_tenant = await _access(user.pk, self.scope.get("session"), self.params.get("run"), None)
        if self.user is None:
            await self.close()
            return
        self.user_topic = user_topic(self.user.pk)
        self.topic_fragments: dict[str, set[str]] = {}
        for name in self.fragments:
            for topic in live.topics_for(name, self.params):
                self.topic_fragments.setdefault(topic, set()).add(name)
        for topic in [*self.topic_fragments, self.user_topic]:
            await self.channel_layer.group_add(group_for(topic), self.channel_name)
            self.live_groups.append(group_for(topic))
        OUTAGES.up(REDIS)  # logs the end of an outage this process noted, if any
        await self.accept()
        self._rejoiner = asyncio.create_task(self._rejoin())
        self._changed(set(self.fragments))  # catch up on anything since the page was rendered

    async def disconnect(self, code: int) -> None:
        self._stop_tasks()
        try:
            for group in getattr(self, "live_groups", []):
                await self.channel_layer.group_discard(group, self.channel_name)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            note_failure(exc, doing="leaving live groups")  # the membership expires by itself

    async def _rejoin(self) -> None:
        while True:
            await asyncio.sleep(REJOIN_INTERVAL)
            try:
                for group in self.live_groups:
                    await self.channel_layer.group_add(group, self.channel_name)
            except Exception as exc:
                if is_storage_error(exc):  # Redis is away: one line per outage, not per socket
                    note_failure(exc, doing="renewing live group membership")
                else:
                    log.exception("could not renew live group membership; trying again later")

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Pages send nothing; anything sent is ignored."""

    async def live_changed(self, event: dict[str, Any]) -> None:
        """A group event of type ``topics.EVENT_TYPE`` ("live.changed"): the topic's data changed.
        The fragments that follow that topic, by its name, are rendered again; on the user's own
        topic, their access is checked again."""
        topic = event.get("topic", "")
        if topic == self.user_topic:
            await self._check_access()
            return
        self._changed(self.topic_fragments.get(topic, set()))

    def _changed(self, fragments: set[str]) -> None:
        if not fragments or self._revoked:
            return
        self._dirty |= fragments
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._dirty:
                wait = self._last_push + PUSH_INTERVAL - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                names = [n for n in self.fragments if n in self._dirty]
                self._dirty.clear()
                self._last_push = loop.time()
                if not await self._push(names):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not is_storage_error(exc):
                log.exception("live push failed for %s", getattr(self.user, "pk", None))
                return
            # PostgreSQL or Redis is away: one line per outage, not a traceback per socket and
            # fragment; the page reconnects and its first push catches up on what it missed.
            note_failure(exc, doing="pushing live pages; open pages say 'reconnecting' and retry")
            self._revoked = True
            await self.close(code=CLOSE_RETRY)

    async def _check_access(self) -> bool:
        """Close the socket (and push nothing more) if the user may no longer see the page."""
        user, code, self._run_tenant = await _access(
            self.user.pk, self.scope.get("session"), self.params.get("run"), self._run_tenant
        )
        if self._revoked:
            return False  # closed meanwhile (a push and an account change checked at once)
        if user is None:
            self._revoked = True
            await self.close(code=code)
            return False
        self.user = user
        return True

    async def _push(self, names: list[str]) -> bool:
        if not await self._check_access():
            return False
        user = self.user
        # render_fragment turns any failure but a storage error into a stale notice itself.
        parts = [await database_sync_to_async(live.render_fragment)(name, user, self.params) for name in names]
        if parts:
            await self.send(text_data="\n".join(parts))
        return True

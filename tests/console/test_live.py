"""Live pages: a committed change reaches open sockets, and nothing else does.

Real PostgreSQL, the real Redis channel layer (the tests' own Redis database), the real
ASGI application (origin check, session auth, routing, consumer), driven with channels'
``WebsocketCommunicator``. The test process is also the worker (``advance`` in-process).

Nothing waits a fixed time for things to settle: broadcasts made before a socket connects are
flushed first (``_connected``), so the catch-up push is the only one before the test acts.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils.html import format_html

from config.asgi import application
from console import broadcast as live_broadcast
from console import consumers, live, topics
from operators import roles
from operators.models import AuditEntry
from sagas import start
from sagas.events import PROGRESS_INTERVAL, run_changed
from sagas.models import WorkflowRun
from sagas.replay.engine import Outcome, advance
from sagas.versions.registry import workflow

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://localhost")
HANG = 120.0  # only a guard against a real hang: a push that is due is waited for this long


def _test_run_status(user, params: dict[str, str]) -> str:
    run = WorkflowRun.objects.get(id=params["run"])
    return format_html('<p id="live-test_run_status">{} {}</p>', run.id, run.status)


@pytest.fixture(autouse=True)
def run_status_fragment(monkeypatch):  # a small fragment of this module's own: a run's id and status
    monkeypatch.setitem(live.FRAGMENTS, "test_run_status",
                        live.Fragment("test_run_status", _test_run_status, (topics.THIS_RUN,)))


progress_seen = threading.Event()  # set when a "progress" signal is sent
claimed_seen = threading.Event()  # set when the claim's signal is sent


def _step_of(i: int, last: bool, before_last: bool = False) -> str:
    """The step before the last returns once the claim was announced (a step recorded after it
    is progress the heartbeat has not reported: on a quick machine every other step may be done
    by then); the last one returns once a "progress" signal was sent."""
    if before_last and not claimed_seen.wait(HANG):
        raise RuntimeError("the claim was never announced")
    if last and not progress_seen.wait(HANG):
        raise RuntimeError("no progress signal while the run went on")
    return "ok"


@workflow("live_two_steps", version=1)
def live_two_steps(ctx, spec):
    return [ctx.step("a", int, 1), ctx.step("b", int, 2)]


@workflow("live_many_steps", version=1)
def live_many_steps(ctx, spec):
    for i in range(spec["steps"]):
        ctx.step("s", _step_of, i, i == spec["steps"] - 1, i == spec["steps"] - 2)
    return "done"


def _user(name: str, *groups: str, **fields) -> User:
    user = User.objects.create_user(name, password="pw-for-tests", **fields)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def _cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


@pytest.fixture
def viewer_cookie() -> bytes:
    return _cookie(_user("vera", roles.VIEWER))


def _socket(query: str, cookie: bytes | None = None) -> WebsocketCommunicator:
    headers = [ORIGIN] + ([(b"cookie", cookie)] if cookie else [])
    return WebsocketCommunicator(application, f"/ws/live/?{query}", headers=headers)


async def _receive_until(socket: WebsocketCommunicator, wanted: str) -> str:
    """The first push containing ``wanted`` (each push waited for at most HANG)."""
    while wanted not in (message := await socket.receive_from(timeout=HANG)):
        pass
    return message


async def _connected(query: str, cookie: bytes | None) -> tuple[WebsocketCommunicator, str]:
    """A connected socket and its catch-up push, the only one before the test acts: broadcasts
    made before (a user created, a run started) are sent before the socket joins its groups."""
    assert await database_sync_to_async(live_broadcast.publisher.flush)()
    socket = _socket(query, cookie)
    connected, _ = await socket.connect(timeout=HANG)
    assert connected
    return socket, await socket.receive_from(timeout=HANG)


# --- access ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "a user without a console role"])
def test_it_refuses_a_connection(who):
    cookie = None if who == "anonymous" else _cookie(_user("nobody"))

    async def scenario():
        connected, _ = await _socket("fragments=overview", cookie).connect(timeout=HANG)
        assert not connected

    async_to_sync(scenario)()


def test_it_refuses_a_malformed_run_id_and_ignores_unknown_fragments(viewer_cookie):
    async def scenario():
        bad = _socket("fragments=test_run_status&run=not-a-uuid", viewer_cookie)
        assert (await bad.connect(timeout=HANG))[0] is False
        nothing_known = _socket("fragments=no_such_fragment", viewer_cookie)
        assert (await nothing_known.connect(timeout=HANG))[0] is False
        mixed = _socket("fragments=no_such_fragment,overview", viewer_cookie)
        assert (await mixed.connect(timeout=HANG))[0] is True
        first = await mixed.receive_from(timeout=HANG)
        assert 'id="live-overview"' in first and "no_such_fragment" not in first
        await mixed.disconnect()

    async_to_sync(scenario)()


def test_it_disconnects_a_viewer_whose_role_was_removed():
    user = _user("revoked", roles.VIEWER)
    cookie = _cookie(user)

    async def scenario():
        socket = _socket("fragments=overview", cookie)
        assert (await socket.connect(timeout=HANG))[0]
        await socket.receive_from(timeout=HANG)
        await database_sync_to_async(user.groups.clear)()
        await database_sync_to_async(start)("live_two_steps", {})
        closed = await socket.receive_output(timeout=HANG)
        assert closed == {"type": "websocket.close", "code": consumers.CLOSE_FORBIDDEN}

    async_to_sync(scenario)()


# --- pushes ------------------------------------------------------------------------------


@pytest.fixture
def heard(monkeypatch) -> list[dict]:
    """Every group event a live socket of this process handled, in order (pushed or not)."""
    events: list[dict] = []
    handle = consumers.LiveConsumer.live_changed

    async def recording(self, event):
        events.append(event)
        await handle(self, event)

    monkeypatch.setattr(consumers.LiveConsumer, "live_changed", recording)
    return events


def test_it_pushes_the_overview_to_a_viewer_when_a_run_starts(viewer_cookie):
    async def scenario():
        socket, before = await _connected("fragments=overview", viewer_cookie)  # the catch-up push
        assert 'id="live-overview"' in before

        await database_sync_to_async(start)("live_two_steps", {}, business_key="order-1")
        pushed = await socket.receive_from(timeout=HANG)
        assert 'id="live-overview"' in pushed
        assert pushed != before  # rendered after the commit: the counts moved
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_pushes_a_run_page_the_new_status_and_nothing_about_other_runs(viewer_cookie, heard):
    run = start("live_two_steps", {})
    other = start("live_two_steps", {"other": True})
    own_topic = topics.run_topic(run.id)

    async def scenario():
        socket, first = await _connected(f"fragments=test_run_status&run={run.id}", viewer_cookie)
        assert f'id="live-test_run_status">{run.id} PENDING' in first

        assert await database_sync_to_async(advance)(str(other.id), owner="t") == Outcome.COMPLETED
        assert await database_sync_to_async(live_broadcast.publisher.flush)()
        # A probe on the run's own topic, sent after everything the other run's finish broadcast:
        # a socket hears its events in order, so anything about the other run would come first.
        await get_channel_layer().group_send(topics.group_for(own_topic), {"type": topics.EVENT_TYPE,
                                                                            "topic": own_topic, "probe": True})
        probed = await socket.receive_from(timeout=HANG)
        assert f"{run.id} PENDING" in probed
        assert [e.get("probe") for e in heard] == [True], heard  # nothing about the other run reached it

        assert await database_sync_to_async(advance)(str(run.id), owner="t") == Outcome.COMPLETED
        await _receive_until(socket, f"{run.id} COMPLETED")
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_coalesces_a_burst_into_few_pushes_and_keeps_the_last_change(viewer_cookie, heard, monkeypatch):
    """30 changes (the run's finish among the last) arrive while a push is on its way: the
    socket gets that push, then one more for all 30, and that one shows the last change."""
    run = start("live_two_steps", {})
    group = topics.group_for(topics.run_topic(run.id))
    gate: dict = {}
    push = consumers.LiveConsumer._push

    async def gated_push(self, names):
        if gate.pop("armed", False):  # the first push after arming waits (in the event loop) until released
            gate["entered"].set()
            await gate["release"].wait()
        return await push(self, names)

    monkeypatch.setattr(consumers.LiveConsumer, "_push", gated_push)

    async def scenario():
        socket, _ = await _connected(f"fragments=test_run_status&run={run.id}", viewer_cookie)
        layer = get_channel_layer()
        gate.update(armed=True, entered=asyncio.Event(), release=asyncio.Event())
        for i in range(30):
            if i == 29:
                assert await database_sync_to_async(advance)(str(run.id), owner="t") == Outcome.COMPLETED
                # its own broadcasts are out before the last change
                assert await database_sync_to_async(live_broadcast.publisher.flush)()
            await layer.group_send(group, {"type": topics.EVENT_TYPE, "topic": f"run.{run.id}", "n": i})
            if i == 0:  # the first change's push is on its way, and stays so until released
                await asyncio.wait_for(gate["entered"].wait(), HANG)
        deadline = asyncio.get_running_loop().time() + HANG
        while not any(e.get("n") == 29 for e in heard):  # until the socket heard the 30th change
            assert asyncio.get_running_loop().time() < deadline, heard
            await asyncio.sleep(0.01)
        gate["release"].set()
        pushes = [await socket.receive_from(timeout=HANG) for _ in range(2)]
        assert await socket.receive_nothing(timeout=1.0)  # and no third
        assert f"{run.id} COMPLETED" in pushes[-1]
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_routes_each_topic_to_the_fragments_that_follow_it_by_name(viewer_cookie):
    """A page with two regions hears a change only in the region that follows its topic."""
    async def scenario():
        # the catch-up push renders all three
        socket, first = await _connected("fragments=effects_queue,audit_log,versions_list", viewer_cookie)
        assert all(f'id="live-{name}"' in first for name in ("effects_queue", "audit_log", "versions_list"))
        layer = get_channel_layer()
        for topic, region, others in (("audit", "audit_log", ("effects_queue", "versions_list")),
                                      ("effects", "effects_queue", ("audit_log", "versions_list")),
                                      ("runs", "versions_list", ("effects_queue", "audit_log"))):
            await layer.group_send(topics.group_for(topic), {"type": topics.EVENT_TYPE, "topic": topic})
            pushed = await socket.receive_from(timeout=HANG)  # one change, one push
            assert f'id="live-{region}"' in pushed, topic
            assert not any(f'id="live-{other}"' in pushed for other in others), topic
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_pushes_the_audit_log_when_an_audit_entry_is_written(viewer_cookie, monkeypatch):
    def _count(user, params):
        return format_html('<p id="live-audit_test_count">{}</p>', AuditEntry.objects.count())

    monkeypatch.setitem(live.FRAGMENTS, "audit_test_count", live.Fragment("audit_test_count", _count, (topics.AUDIT,)))

    async def scenario():
        socket, first = await _connected("fragments=audit_test_count", viewer_cookie)
        # (the fixture's role grant is in the log already: console/user_audit.py)
        before = int(first.split(">")[1].split("<")[0])
        await database_sync_to_async(AuditEntry.objects.create)(
            actor_label="op", action="run.cancel", object_type="run", object_id="x", outcome="ok"
        )
        await _receive_until(socket, f">{before + 1}<")
        await socket.disconnect()

    async_to_sync(scenario)()


# --- the engine stays cheap, and Redis stays optional ------------------------------------


def test_it_sends_no_redis_traffic_per_step_of_a_worker(monkeypatch):
    """200 steps make two signals (claimed, completed), and the heartbeat adds a "progress" one
    at most once per PROGRESS_INTERVAL so that an open run page keeps moving. Load-proof: the
    last step waits for a progress signal, and the spacing is read from the heartbeat's decisions."""
    from sagas.runtime.heartbeat import Heartbeat

    steps = 200
    causes: Counter[str] = Counter()
    decided_at: list[float] = []
    report = Heartbeat._report_progress

    def recording_report(self):
        before = self._progress_sent
        report(self)
        decided_at.extend([self._progress_sent] if self._progress_sent != before else [])  # when it decided

    def count(sender, cause, **kwargs):
        causes[cause] += 1
        if cause == "progress":
            progress_seen.set()
        if cause == "claimed":
            claimed_seen.set()

    monkeypatch.setattr(Heartbeat, "_report_progress", recording_report)
    progress_seen.clear()
    claimed_seen.clear()
    run_changed.connect(count, weak=False, dispatch_uid="test-live-count")
    try:
        run = start("live_many_steps", {"steps": steps})
        assert live_broadcast.publisher.flush()
        out_before = live_broadcast.publisher.topics_out
        assert advance(str(run.id), owner="t") == Outcome.COMPLETED
        assert live_broadcast.publisher.flush()
        topics_out = live_broadcast.publisher.topics_out - out_before
    finally:
        run_changed.disconnect(dispatch_uid="test-live-count")
    run.refresh_from_db()
    assert run.steps_used == steps
    assert causes["claimed"] == 1 and causes["completed"] == 1
    assert causes["progress"] >= 1  # the run page moved while the steps ran
    assert len(decided_at) == causes["progress"]
    # ... but not per step: the heartbeat spaces them by its clock.
    gaps = [later - earlier for earlier, later in zip(decided_at, decided_at[1:])]
    assert all(gap >= PROGRESS_INTERVAL for gap in gaps), gaps
    # A progress signal is the run's own topic; any other signal at most four topics.
    assert 1 <= topics_out <= 4 * (sum(causes.values()) - causes["progress"]) + causes["progress"] < steps


def test_it_keeps_writing_when_redis_is_down(monkeypatch):
    publisher = live_broadcast.publisher
    assert publisher.flush()
    nowhere = lambda: RedisChannelLayer(hosts=["redis://127.0.0.1:1/0"], prefix="sagas-console:")  # noqa: E731
    monkeypatch.setattr(publisher, "make_layer", nowhere)
    monkeypatch.setattr(publisher, "layer", nowhere())
    failed_before = publisher.failed_batches

    run = start("live_two_steps", {})  # broadcasts after commit, into a dead Redis
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    assert publisher.flush(timeout=HANG)
    assert publisher.failed_batches > failed_before

    monkeypatch.undo()  # Redis is back: the next change goes out
    publisher.layer = None
    layer = get_channel_layer()
    listener = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(topics.group_for("runs"), listener)
    live_broadcast.broadcast("runs")
    assert publisher.flush(timeout=HANG)

    async def heard():
        return await asyncio.wait_for(layer.receive(listener), timeout=HANG)

    assert async_to_sync(heard)() == {"type": topics.EVENT_TYPE, "topic": "runs"}


def _postgres_away(user, params: dict[str, str]) -> str:
    import psycopg

    with psycopg.connect("postgresql://sagas@127.0.0.1:1/sagas", connect_timeout=2):  # nobody listens there
        return '<p id="live-test_postgres_away">never</p>'


def test_it_closes_a_socket_for_a_retry_when_postgres_is_away_at_a_push(viewer_cookie, monkeypatch, caplog):
    from core.storage import OUTAGES, POSTGRES

    monkeypatch.setitem(live.FRAGMENTS, "test_postgres_away",
                        live.Fragment("test_postgres_away", _postgres_away, (topics.RUNS,)))

    async def scenario():
        socket = _socket("fragments=test_postgres_away", viewer_cookie)
        connected, _ = await socket.connect(timeout=HANG)
        assert connected
        closed = await socket.receive_output(timeout=HANG)  # the catch-up push meets the outage
        assert closed == {"type": "websocket.close", "code": consumers.CLOSE_RETRY}  # the page retries
        await socket.wait()

    try:
        with caplog.at_level("WARNING"):
            async_to_sync(scenario)()
        assert OUTAGES.is_down(POSTGRES)
        assert any("storage outage" in r.getMessage() for r in caplog.records)
        assert not [r for r in caplog.records if r.exc_info], "a traceback per socket, not one line per outage"
    finally:
        OUTAGES.up(POSTGRES)

"""The run websocket: ``/ws/runs/<id>/?after=<step>&after_log=<log id>[&share=<share link token>]``.

On connect it sends what the browser lacks (points after ``after``, log lines after
``after_log``, the status), then relays what the worker publishes. Points the backlog already
carried are dropped from the live stream, and one catch-up read after the worker's flush
interval fills in points that were published before this viewer joined but stored after its
backlog read: a reconnect leaves no gap and no duplicate.

Metric messages carry the run's sequence number (``seq``, ``live.Publisher``), and the opening
status carries the number current when the backlog was read: a page that sees a number skipped
after that knows the channel layer lost a message and reads the missing steps back from the store
(``series.json?after=``). Messages numbered at or below the opening number were published before
the backlog read and are covered by it and the catch-up: they reach the page without a number.

With Channels' in-memory layer, which is not shared between processes (a worker's publishes never
reach the web process), the consumer reads the database for what is new every ``POLL_SECONDS``
instead: the same messages, a second later at most. The embedded mode does not need this: its
layer (``webapp.dashboard.filelayer``) is shared through files.

Viewers do not join the run's group one by one: a ``RunHub`` holds one channel-layer subscription
per run per process and hands each event to that process's viewers, serialized once. Five hundred
viewers of a run cost Redis one message per event, not five hundred.

Access can end while a socket is open: each viewer also joins the group of its user and, when it
came through a share link, that link's group (``access_groups``). Revoking the link or
removing the user from a team sends ``access.check`` there, and editing or deleting the run sends
it to the run's group (``webapp.dashboard.signals``); the viewer asks ``can`` again and closes with
code 4403 when the answer is no.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import ClassVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer

from webapp.dashboard import live, series
from webapp.runs.access import can
from webapp.runs.models import Run, last_step_of
from webapp.teams.models import ShareLink

# Past this many points behind, the browser is told to reload the downsampled view instead.
BACKLOG_LIMIT = 20000
CATCH_UP_SECONDS = 1.5
LOG_BACKLOG_LINES = 500
POLL_SECONDS = 1.0
# Viewers sent an event between two yields to the event loop.
FAN_OUT_SLICE = 10

logger = logging.getLogger(__name__)


class Event:
    """One event of a run's group as its viewers get it; the JSON text is made once for them all."""

    def __init__(self, message: dict) -> None:
        self.message = message
        self._text: str | None = None
        steps = [step for step, _ in message["steps"]] if message["type"] == "run.metrics" else []
        # Strictly increasing steps: a viewer that has none of them gets the shared text.
        self.first_step = steps[0] if steps else None
        self.shareable = all(a < b for a, b in itertools.pairwise(steps))
        self.seq: int | None = message.get("seq")

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = json.dumps(self._content())
        return self._text

    def _content(self) -> dict:
        event = self.message
        kind = event["type"]
        if kind == "run.metrics":
            points: dict[str, list[list]] = {}
            for step, metrics in event["steps"]:
                for key, value in metrics.items():
                    points.setdefault(key, []).append([step, value])
            return {"type": "metrics", "points": points, **({"seq": self.seq} if self.seq is not None else {})}
        if kind == "run.status":
            return {"type": "status", "status": event["status"], "steps": event["steps"], "error": event.get("error", ""),
                    "started_at": event.get("started_at"), "worker": event.get("worker", ""), "attempts": event.get("attempts")}
        if kind == "run.logs":
            return {"type": "logs", "lines": event["lines"]}
        return {"type": "episodes", "step": event["step"], "count": event["count"]}


class RunHub:
    """This process's subscription to one run's group, relaying each event to the local viewers."""

    _hubs: ClassVar[dict[tuple[int, int], RunHub]] = {}

    @classmethod
    async def join(cls, layer, run_id: int, viewer: RunConsumer) -> RunHub:
        """Add ``viewer``; returns once the process is in the run's group (events from then on reach it)."""
        key = (id(layer), run_id)
        hub = cls._hubs.get(key)
        if hub is None or hub.layer is not layer or hub.loop is not asyncio.get_running_loop():
            hub = cls._hubs[key] = cls(layer, run_id)
        hub.viewers.add(viewer)
        try:
            await asyncio.shield(hub.joined)
        except Exception:  # the broker refused: the next viewer tries again with a new hub
            hub.viewers.discard(viewer)
            if cls._hubs.get(key) is hub:
                del cls._hubs[key]
            raise
        return hub

    def __init__(self, layer, run_id: int) -> None:
        self.layer, self.run_id, self.loop = layer, run_id, asyncio.get_running_loop()
        self.viewers: set[RunConsumer] = set()
        self.relay: asyncio.Task | None = None
        self.joined = asyncio.ensure_future(self._join())

    async def _join(self) -> None:
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(live.group_name(self.run_id), self.channel)
        self.relay = asyncio.create_task(self._relay())

    async def _relay(self) -> None:
        failing = False  # one warning per outage, not a traceback a second
        while True:
            try:
                message = await self.layer.receive(self.channel)
                if message["type"] == "access.check":  # the run's visibility changed, or it was deleted
                    for viewer in list(self.viewers):
                        await viewer.access_check(message)
                    continue
                event = Event(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker outage: the viewers' reconnect or the next event repairs it
                if not failing:
                    logger.warning("receiving run %s's events failed (%s: %s); retrying every second",
                                   self.run_id, exc.__class__.__name__, exc)
                failing = True
                await asyncio.sleep(1)
                continue
            failing = False
            for position, viewer in enumerate(list(self.viewers), 1):
                try:
                    await viewer.deliver(event)
                except Exception as exc:  # its socket is gone: it leaves the fan-out now, not at every event
                    logger.warning("dropping a viewer of run %s: %s: %s", self.run_id, exc.__class__.__name__, exc)
                    self.viewers.discard(viewer)
                if position % FAN_OUT_SLICE == 0:
                    # A send only queues the frame; the server writes it when the loop runs. Yielding
                    # now and then lets the first viewers' frames leave while the rest are queued.
                    await asyncio.sleep(0)

    async def leave(self, viewer: RunConsumer) -> None:
        self.viewers.discard(viewer)
        if self.viewers:
            return
        if self._hubs.get((id(self.layer), self.run_id)) is self:
            del self._hubs[(id(self.layer), self.run_id)]
        try:
            await self.joined
        except Exception:  # noqa: BLE001 (never joined: nothing to leave)
            return
        self.relay.cancel()
        try:  # until it has left the layer's receive (channels-redis counts receivers per loop)
            await self.relay
        except asyncio.CancelledError:
            pass
        await self.layer.group_discard(live.group_name(self.run_id), self.channel)


class RunConsumer(AsyncJsonWebsocketConsumer):
    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however the consumer ends (an error included), it leaves the fan-out at once
            await self._leave_hub()

    async def _leave_hub(self) -> None:
        hub = self.__dict__.pop("hub", None)
        if hub is not None:
            await hub.leave(self)

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.share_token = query.get("share", [None])[0]
        groups = await _read(_access_groups)(self.scope.get("user"), self.run_id, self.share_token)
        if groups is None:
            await self.close(code=4403)
            return
        self.access_groups = groups
        for group in self.access_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        after = _int(query.get("after", ["-1"])[0], -1)
        after_log = _int(query.get("after_log", ["0"])[0], 0)
        # Join before reading the backlog: what is published meanwhile waits in ``pending``.
        self.pending: list[Event] | None = []
        self.hub = await RunHub.join(self.channel_layer, self.run_id, self)
        try:
            await self._start(after, after_log)
        except BaseException:
            await self._leave_hub()
            raise

    async def _start(self, after: int, after_log: int) -> None:
        """Accept, send the backlog, then what the hub relayed meanwhile; start the catch-up (or polling)."""
        await self.accept()
        backlog = await _read(_backlog)(self.run_id, after, after_log)
        self.sent_through = max(after, backlog["last_step"])
        # Steps the live stream carried before the catch-up read; after it, sent_through alone
        # tracks what was sent (so a long run does not grow a set per viewer).
        self.live_steps: set[int] = set()
        self.caught_up = False
        self.opening_seq = backlog["status"]["seq"]
        await self.send_json(backlog["status"])
        if backlog["logs"]:
            await self.send_json({"type": "logs", "lines": backlog["logs"]})
        if backlog["resync"]:
            await self.send_json({"type": "resync", "last_step": backlog["last_step"]})
        elif backlog["points"]:
            await self.send_json({"type": "metrics", "points": backlog["points"]})
        self.last_log_id = backlog["logs"][-1]["id"] if backlog["logs"] else after_log
        self.status_seen = (backlog["status"]["status"], backlog["status"]["steps"])
        while self.pending:
            await self._handle(self.pending.pop(0))
        self.pending = None
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            self.catch_up = asyncio.create_task(self._poll_database())
        else:
            self.catch_up = asyncio.create_task(self._catch_up(self.sent_through))

    async def disconnect(self, code: int) -> None:
        task = getattr(self, "catch_up", None)
        if task:
            task.cancel()
        await self._leave_hub()
        for group in getattr(self, "access_groups", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def access_check(self, message: dict) -> None:
        """Someone's access may have ended (a share link revoked, a member removed): ask again."""
        if not await _read(_may_view)(self.scope.get("user"), self.run_id, self.share_token):
            await self.close(code=4403)
            await self.disconnect(4403)  # stop relaying now, not when the client acknowledges

    async def receive_json(self, content, **kwargs) -> None:
        pass  # the browser only listens; zoom and search go through the JSON endpoints

    # -- events from the worker, relayed by the hub ------------------------------------------------
    async def deliver(self, event: Event) -> None:
        if self.pending is not None:  # still sending the backlog
            self.pending.append(event)
        else:
            await self._handle(event)

    async def _handle(self, event: Event) -> None:
        kind = event.message["type"]
        if kind == "run.metrics":
            await self._metrics(event)
            return
        if kind == "run.logs":
            ids = [line["id"] for line in event.message["lines"] if "id" in line]
            self.last_log_id = max([self.last_log_id] + ids)
        await self.send(text_data=event.text)

    async def _metrics(self, event: Event) -> None:
        steps = event.message["steps"]
        numbered = event.seq is not None and event.seq > self.opening_seq
        if event.shareable and event.first_step is not None and event.first_step > self.sent_through \
                and not any(step in self.live_steps for step, _ in steps) and (numbered or event.seq is None):
            self._mark_sent([step for step, _ in steps])
            await self.send(text_data=event.text)
            return
        points: dict[str, list[list]] = {}
        fresh = [step for step, _ in steps if step > self.sent_through and step not in self.live_steps]
        for step, metrics in steps:
            if step in fresh:
                for key, value in metrics.items():
                    points.setdefault(key, []).append([step, value])
        self._mark_sent(fresh)
        if numbered:  # even with every point already sent: the page counts the numbers
            await self.send_json({"type": "metrics", "points": points, "seq": event.seq})
        elif points:
            await self.send_json({"type": "metrics", "points": points})

    def _mark_sent(self, steps: list[int]) -> None:
        if not steps:
            return
        if self.caught_up:
            self.sent_through = max(self.sent_through, max(steps))
        else:
            self.live_steps.update(steps)

    async def _catch_up(self, backlog_step: int) -> None:
        await asyncio.sleep(CATCH_UP_SECONDS)
        stored = await _read(series.points_after)(self.run_id, backlog_step)
        await self._send_stored(stored)

    async def _send_stored(self, stored: dict[str, list[list]]) -> None:
        """Send stored points the live stream has not already carried; advance ``sent_through``."""
        missing: dict[str, list[list]] = {}
        for key, pairs in stored.items():
            for step, value in pairs:
                if step not in self.live_steps:
                    missing.setdefault(key, []).append([step, value])
        if missing:
            await self.send_json({"type": "metrics", "points": missing})
        last_stored = max((pairs[-1][0] for pairs in stored.values()), default=-1)
        self.live_steps = {s for s in self.live_steps if s > last_stored}
        self.sent_through = max(self.sent_through, last_stored)
        self.caught_up = True

    async def _poll_database(self) -> None:
        """Send what the database holds beyond what this viewer has, once a second, until the run ends."""
        while True:
            await asyncio.sleep(POLL_SECONDS)
            news = await _read(_news)(self.run_id, self.sent_through, self.last_log_id)
            if news["logs"]:
                self.last_log_id = news["logs"][-1]["id"]
                await self.send_json({"type": "logs", "lines": news["logs"]})
            await self._send_stored(news["points"])
            status = news["status"]
            if (status["status"], status["steps"]) != self.status_seen:
                self.status_seen = (status["status"], status["steps"])
                await self.send_json(status)
            if status["status"] in Run.FINAL and not news["points"] and not news["logs"]:
                return


def _read(function):
    """``function`` (database reads only) run in a thread of the event loop's pool. Channels runs
    every ``database_sync_to_async`` call of a process in one thread, one after another: hundreds of
    viewers opening at once then wait on each other's queries, not on the database."""
    return database_sync_to_async(function, thread_sensitive=False)


def _news(run_id: int, after: int, after_log: int) -> dict:
    """Points after step ``after``, log lines after id ``after_log``, and the status, of one run."""
    run = Run.objects.get(pk=run_id)
    logs = list(run.logs.filter(id__gt=after_log).order_by("id").values("id", "time", "level", "message")[:LOG_BACKLOG_LINES])
    points = series.points_after(run_id, after)
    return {
        "status": {"type": "status", **live.status_of(run)},
        "logs": [{**line, "time": line["time"].isoformat()} for line in logs],
        "points": points,
    }


def _may_view(user, run_id: int, share_token: str | None = None) -> bool:
    """The session's user may see the run, or the request holds an active share link of it."""
    from django.contrib.auth.models import AnonymousUser

    run = Run.objects.filter(pk=run_id).first()
    return run is not None and can(user or AnonymousUser(), run, "view", share_token)


def _access_groups(user, run_id: int, share_token: str | None) -> list[str] | None:
    """The groups a viewer joins (``access_groups``), or None when it may not view the run:
    one read for both, as a connection storm makes every read count."""
    return access_groups(user, run_id, share_token) if _may_view(user, run_id, share_token) else None


def access_groups(user, run_id: int, share_token: str | None) -> list[str]:
    """The groups a viewer of ``run_id`` joins, so that losing access closes its socket."""
    groups = [live.user_group(user.pk)] if user is not None and user.is_authenticated else []
    if share_token:
        link = ShareLink.objects.active().filter(run_id=run_id, token=share_token).values_list("pk", flat=True).first()
        if link is not None:
            groups.append(live.share_link_group(link))
    return groups


def _backlog(run_id: int, after: int, after_log: int) -> dict:
    # Before the points: a message numbered past this was sent after this read, when the viewer's
    # hub was in the run's group already, so it reaches the viewer unless the layer loses it.
    seq = live.sequences().current(run_id)
    run = Run.objects.get(pk=run_id)
    status = {"type": "status", **live.status_of(run), "seq": seq}
    logs = list(run.logs.filter(id__gt=after_log).order_by("-id").values("id", "time", "level", "message")[:LOG_BACKLOG_LINES])
    logs = [{**line, "time": line["time"].isoformat()} for line in reversed(logs)]
    last_step = last_step_of(run_id)
    points = series.points_after_at_most(run_id, after, BACKLOG_LIMIT, through=last_step)
    if points is None:
        return {"status": status, "logs": logs, "resync": True, "points": {}, "last_step": last_step}
    through = max([after] + [pairs[-1][0] for pairs in points.values()])
    return {"status": status, "logs": logs, "resync": False, "points": points, "last_step": through}


def _int(value: str, default: int) -> int:
    try:
        return int(value)
    except ValueError:
        return default

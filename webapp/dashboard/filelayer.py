"""A Channels layer on the local file system, for the embedded mode's processes.

The embedded platform (``make run``) has no Redis, and its web server and its worker are separate
processes, so Channels' in-memory layer cannot carry a worker's publish to the web process. This
layer can: every process that points at the same folder shares channels and groups, the way the
embedded Celery broker (kombu's ``filesystem://`` transport) shares its queues. No maintained
package does this without a server (channels-redis needs Redis, channels-postgres PostgreSQL).

Layout under ``path``::

    channels/<channel>/<nanoseconds>-<random>.json   one message; names sort in arrival order
    groups/<group>/<channel>                         one membership; its mtime is the join time
    tmp/                                             where messages are written before a rename

A message appears in its channel by an atomic ``os.replace`` and is taken by an atomic rename into
``tmp/``, so a reader never sees half a message and two readers never take the same one.
``receive`` polls its channel's folder every ``poll_seconds`` (a directory listing: microseconds).
Messages older than ``expiry`` are dropped; a member whose oldest message has expired is not
reading any more and leaves its groups, as in Channels' in-memory layer. Messages are JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer


class FileChannelLayer(BaseChannelLayer):
    extensions = ["groups", "flush"]

    def __init__(self, path: str, expiry: int = 60, group_expiry: int = 86400, capacity: int = 100,
                 channel_capacity=None, poll_seconds: float = 0.02) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        self.channel_capacity = self.compile_capacities(channel_capacity or {})
        self.root = Path(path)
        self.group_expiry = group_expiry
        self.poll_seconds = poll_seconds
        for folder in ("channels", "groups", "tmp"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)

    # -- channels -----------------------------------------------------------------------------------
    async def send(self, channel: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        folder = self.root / "channels" / channel
        folder.mkdir(exist_ok=True)
        if len(os.listdir(folder)) >= self.get_capacity(channel):
            raise ChannelFull(channel)
        text = json.dumps(message)  # before anything is written: a message that is not JSON raises here
        staged = self.root / "tmp" / f"{secrets.token_hex(8)}.json"
        staged.write_text(text)
        os.replace(staged, folder / f"{time.time_ns():020d}-{secrets.token_hex(4)}.json")

    async def receive(self, channel: str) -> dict:
        self.require_valid_channel_name(channel)
        folder = self.root / "channels" / channel
        while True:
            message = self._take(folder)
            if message is not None:
                return message
            await asyncio.sleep(self.poll_seconds)

    async def new_channel(self, prefix: str = "specific.") -> str:
        return f"{prefix}file!{secrets.token_hex(6)}"

    def _take(self, folder: Path) -> dict | None:
        """The oldest unexpired message of ``folder``, removed from it; None when there is none."""
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return None
        oldest_kept = self._oldest_kept()
        for name in names:
            claimed = self.root / "tmp" / f"taken-{secrets.token_hex(8)}-{name}"
            try:
                os.replace(folder / name, claimed)
            except FileNotFoundError:  # another reader took it
                continue
            try:
                if _sent_at(name) < oldest_kept:
                    continue
                return json.loads(claimed.read_text())
            finally:
                claimed.unlink(missing_ok=True)
        return None

    # -- groups -------------------------------------------------------------------------------------
    async def group_add(self, group: str, channel: str) -> None:
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        members = self.root / "groups" / group
        members.mkdir(exist_ok=True)
        (members / channel).touch()  # (re)joining renews the membership

    async def group_discard(self, group: str, channel: str) -> None:
        self.require_valid_channel_name(channel)
        self.require_valid_group_name(group)
        (self.root / "groups" / group / channel).unlink(missing_ok=True)

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        members = self.root / "groups" / group
        try:
            channels = os.listdir(members)
        except FileNotFoundError:
            return
        now = time.time()
        for channel in channels:
            try:
                joined = (members / channel).stat().st_mtime
            except FileNotFoundError:
                continue
            if joined < now - self.group_expiry or self._stalled(channel):
                self._leave_all_groups(channel)
                continue
            try:
                await self.send(channel, message)
            except ChannelFull:
                pass  # as channels-redis: a full member misses the message, the others get it

    def _stalled(self, channel: str) -> bool:
        """Whether the channel holds a message older than ``expiry``: nobody is reading it."""
        try:
            names = os.listdir(self.root / "channels" / channel)
        except FileNotFoundError:
            return False
        return bool(names) and _sent_at(min(names)) < self._oldest_kept()

    def _oldest_kept(self) -> int:
        """The send time (ns) before which a message has expired."""
        return time.time_ns() - self.expiry * 1_000_000_000

    def _leave_all_groups(self, channel: str) -> None:
        for members in (self.root / "groups").iterdir():
            (members / channel).unlink(missing_ok=True)
        shutil.rmtree(self.root / "channels" / channel, ignore_errors=True)

    # -- flush extension ----------------------------------------------------------------------------
    async def flush(self) -> None:
        for folder in ("channels", "groups", "tmp"):
            shutil.rmtree(self.root / folder, ignore_errors=True)
            (self.root / folder).mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        pass  # no connection to close


def _sent_at(name: str) -> int:
    """The send time (ns) in a message file's name."""
    return int(name.split("-", 1)[0])

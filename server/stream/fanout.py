"""Realtime fan-out to browsers, with per-client latest-value coalescing.

`Fanout` is the small interface the rest of the server publishes through; `LocalFanout`
delivers to SSE streams of this process (the embedded default). With Supabase configured,
`crashdrill.server.stream.realtime.RealtimeFanout` wraps it: SSE as here, plus one Broadcast
message per pair per tick that the page subscribes to directly.

Every subscriber holds at most one pending message per key, never a queue:
- "replace" keys (a run's state, the machine sample, resume checks) keep only the newest;
- "append" keys (a run's records) gather records until the client takes them, up to a
  cap; past the cap the oldest are dropped and the message says `"gap": true`, so the
  page refetches the hole from /api/runs/{run}/records?after=….
An append message also says `"after": ID`, the id of the run's record just before its
first one (when the publisher knows it): a page whose newest record id is below that has
missed records however it happened (a reconnect, a hello that raced a batch) and
refetches from its own newest id, gap flag or not.
A client that keeps up receives every record; a slow one gets the latest values.
Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Mode = Literal["replace", "append"]


@dataclass(frozen=True)
class Message:
    """One thing to push. `data` is JSON text (replace) or `items` JSON texts (append)."""

    event: str  # the SSE event name
    key: str  # coalescing key, e.g. "records:RUN", "run:RUN", "machine"
    mode: Mode = "replace"
    data: str = ""
    items: Sequence[str] = ()
    run: str | None = None
    last_id: int | None = None  # SSE id (the newest record id carried)
    after_id: int | None = None  # append: the run's record id before the first item
    # A replace message's place in its key's one-way order (a run's state: queued <
    # starting < running/restarting < ended). A subscriber never takes a message ranked
    # below one it already took for that key: a view built before the run ended but
    # published after its final view (two threads read the database) would otherwise
    # leave a finished run showing "running" on the page for good.
    rank: int | None = None

    @functools.cached_property
    def frame(self) -> bytes:
        """This message alone as an SSE frame, built once for all the clients that are
        keeping up (most of them)."""
        return _render(self, self.items, gap=False, last_id=self.last_id)


class Fanout(Protocol):
    def start(self) -> None: ...  # on the event loop, when the lab starts

    def publish(self, channel: str, message: Message) -> None: ...

    def subscribe(self, channels: Iterable[str]) -> Subscriber: ...

    def unsubscribe(self, sub: Subscriber) -> None: ...

    def has_subscribers(self, channel: str) -> bool: ...  # someone follows it (a stream)

    def close(self) -> None: ...


@dataclass
class _Pending:
    message: Message
    items: list[str] = field(default_factory=list)
    gap: bool = False
    last_id: int | None = None
    merged: bool = False  # holds more than `message` alone


class Subscriber:
    """One client's pending messages: at most one per key, records capped."""

    def __init__(self, channels: Sequence[str], max_items: int) -> None:
        self.channels = tuple(channels)
        self.max_items = max_items
        self._pending: dict[str, _Pending] = {}
        self._ranks: dict[str, int] = {}  # the highest rank taken per key (Message.rank)
        self._ready = asyncio.Event()
        self.closed = False
        self.dropped = 0  # records dropped by coalescing (for tests and benchmarks)

    def seen(self, key: str, rank: int) -> None:
        """The client already has a value of `key` at `rank` (the stream's hello): what
        is pending or comes later below it is stale."""
        if rank >= self._ranks.get(key, rank):
            self._ranks[key] = rank
        pending = self._pending.get(key)
        if pending is not None and (pending.message.rank or 0) < rank:
            del self._pending[key]

    def offer(self, message: Message) -> None:
        if message.rank is not None:
            if message.rank < self._ranks.get(message.key, message.rank):
                return  # older than what the client has or will get: never shown
            self._ranks[message.key] = message.rank
        pending = self._pending.get(message.key)
        if message.mode == "replace" or pending is None:
            pending = _Pending(message)
            self._pending[message.key] = pending
        elif message.mode == "append":
            pending.merged = True
        if message.mode == "append":
            pending.items.extend(message.items)
            overflow = len(pending.items) - self.max_items
            if overflow > 0:
                del pending.items[:overflow]
                pending.gap = True
                self.dropped += overflow
        if message.last_id is not None:
            pending.last_id = message.last_id
        self._ready.set()

    async def next(self, timeout: float) -> list[bytes]:
        """The pending messages as SSE frames; [] after `timeout` with nothing new."""
        if not self._pending and not self.closed:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return []
        pending, self._pending = self._pending, {}
        self._ready.clear()
        return [_frame(p) for p in pending.values()]

    def close(self) -> None:
        self.closed = True
        self._ready.set()


def _frame(p: _Pending) -> bytes:
    if not p.merged and not p.gap:
        return p.message.frame
    return _render(p.message, p.items, gap=p.gap, last_id=p.last_id)


def _render(m: Message, items: Sequence[str], *, gap: bool, last_id: int | None) -> bytes:
    if m.mode == "append":
        run = f'"run":{json.dumps(m.run)},' if m.run else ""
        after = f'"after":{m.after_id},' if m.after_id is not None else ""
        data = f'{{{run}"gap":{"true" if gap else "false"},{after}"records":[{",".join(items)}]}}'
    else:
        data = m.data
    head = f"event: {m.event}\n"
    if last_id is not None:
        head += f"id: {last_id}\n"
    return (head + "data: " + data.replace("\n", "\ndata: ") + "\n\n").encode()


def frame(event: str, data: str, event_id: int | None = None) -> bytes:
    """One SSE frame outside the coalescing path (the hello snapshot, backfill)."""
    return _render(Message(event=event, key=event, data=data), (), gap=False, last_id=event_id)


class LocalFanout:
    """Channels of subscribers in this process (SSE)."""

    def __init__(self, max_items: int = 2000) -> None:
        self.max_items = max_items
        self._channels: dict[str, set[Subscriber]] = {}

    def start(self) -> None:
        """Nothing to start: subscribers are served by their own SSE responses."""

    def publish(self, channel: str, message: Message) -> None:
        for sub in self._channels.get(channel, ()):
            sub.offer(message)

    def subscribe(self, channels: Iterable[str]) -> Subscriber:
        sub = Subscriber(list(channels), self.max_items)
        for ch in sub.channels:
            self._channels.setdefault(ch, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        sub.close()
        for ch in sub.channels:
            subs = self._channels.get(ch)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._channels[ch]

    def subscribers(self) -> int:
        return len({s for subs in self._channels.values() for s in subs})

    def has_subscribers(self, channel: str) -> bool:
        return bool(self._channels.get(channel))

    def close(self) -> None:
        for subs in list(self._channels.values()):
            for sub in list(subs):
                self.unsubscribe(sub)

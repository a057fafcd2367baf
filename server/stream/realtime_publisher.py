"""The thread that sends the lab's Broadcast messages to Supabase Realtime.

It owns an asyncio loop and one client made by `supabase.acreate_client` (Supabase's
official Python client, the `crashdrill[supabase]` extra; `connect` below, which the
doctor uses too): its Realtime websocket to SUPABASE_URL/realtime/v1, one joined channel
per pair topic (config.broadcast.ack = true, so Realtime confirms every message), private
when the server has the service key. The event loop of the server only calls `offer`,
which never blocks: the outbox is bounded (`CAPACITY`), and a full outbox leaves the
batch with the caller to coalesce into the next tick.

Sending is paced to `supabase_max_messages_per_s`. A failed send (unreachable, refused,
rejected join, no ack in time) is logged once per outage, retried with exponential
backoff (1 s doubling to 30 s) on a fresh connection, and the message is kept until it
goes out: nothing is dropped here. Channels unused for IDLE_LEAVE_S are left, and at
most MAX_CHANNELS are joined at once (Supabase allows 100 channels per connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from crashdrill.server.settings import Settings

if TYPE_CHECKING:  # the supabase extra's types; the lab imports realtime only when used
    from realtime.types import RealtimeChannelOptions

log = logging.getLogger(__name__)

CAPACITY = 64  # messages waiting in the outbox
MAX_CHANNELS = 90  # Supabase: 100 channels per connection on every plan
IDLE_LEAVE_S = 120.0
ACK_TIMEOUT_S = 10
BACKOFF_S = (1.0, 30.0)  # first retry delay, longest


class PublishError(Exception):
    """Realtime refused or did not confirm a message; the text says what it said."""


async def connect(url: str, key: str, timeout: float) -> Any:
    """A Supabase client for the project at `url` whose Realtime websocket is open.

    The client's own retries are off (one attempt, `timeout` seconds to open): the
    publisher retries with its backoff, the doctor reports the first failure. Close it
    with `await client.realtime.close()`. Raises what the websocket raised (refused
    upgrade, connection refused, timeout) for the caller to name.
    """
    from supabase import AsyncClientOptions, acreate_client

    # Passed through to realtime-py's client; `timeout` is one of its arguments although
    # supabase's RealtimeClientOptions does not list it.
    realtime: Any = {"auto_reconnect": False, "max_retries": 1, "timeout": int(timeout)}
    client = await acreate_client(url, key, options=AsyncClientOptions(realtime=realtime))
    await client.realtime.connect()
    return client


def channel_params(*, ack: bool, private: bool) -> RealtimeChannelOptions:
    """A channel's join config: Broadcast only (no presence), acknowledged or not."""
    return {
        "config": {
            "broadcast": {"ack": ack, "self": False},
            "presence": {"key": "", "enabled": False},
            "private": private,
        }
    }


class Publisher:
    def __init__(
        self,
        url: str,
        key: str,
        *,
        private: bool,
        max_per_s: float,
        event: str = "batch",
        capacity: int = CAPACITY,
    ) -> None:
        self.project_url = url.rstrip("/")
        self.url = self.project_url + "/realtime/v1"  # for log lines
        self._key = key
        self.private = private
        self.interval = 1.0 / max_per_s
        self.event = event
        self.capacity = capacity
        self._outbox: deque[tuple[str, str]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._client: Any = None
        self._channels: dict[str, Any] = {}
        self._used: dict[str, float] = {}
        self.sent = 0
        self.failures = 0  # failed attempts in the current outage
        self.last_error: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Publisher:
        key = settings.supabase_service_key or settings.supabase_anon_key or ""
        return cls(
            settings.supabase_url or "",
            key,
            private=bool(settings.supabase_service_key),
            max_per_s=settings.supabase_max_messages_per_s,
        )

    def __repr__(self) -> str:  # never the key
        return f"Publisher({self.url!r}, private={self.private}, sent={self.sent})"

    # ---- called from the server's loop ---------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        # realtime-py (under the supabase client) logs an error line on every failed
        # attempt; this module says it once.
        client_log = logging.getLogger("realtime")
        if client_log.level == logging.NOTSET:
            client_log.setLevel(logging.CRITICAL)
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="crashdrill-realtime", daemon=True
        )
        self._thread.start()
        ready.wait(5)

    def full(self) -> bool:
        with self._lock:
            return len(self._outbox) >= self.capacity

    def offer(self, topic: str, payload: str) -> bool:
        """Queue one message (JSON text); False when the outbox is full."""
        with self._lock:
            if len(self._outbox) >= self.capacity or self._stopping:
                return False
            self._outbox.append((topic, payload))
        self._poke()
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._outbox)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued for up to `timeout` seconds, then stop."""
        deadline = time.monotonic() + timeout
        while self.pending() and self.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stopping = True
        self._poke()
        if self._thread is not None:
            self._thread.join(max(0.5, deadline - time.monotonic()))

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)

    # ---- the thread -----------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._wake = asyncio.Event()
            ready.set()
            loop.run_until_complete(self._main())
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._reset())
            self._loop = None
            loop.close()

    async def _main(self) -> None:
        assert self._wake is not None
        next_at = 0.0
        backoff = BACKOFF_S[0]
        while not self._stopping:
            with self._lock:
                head = self._outbox[0] if self._outbox else None
            if head is None:
                self._wake.clear()
                await self._leave_idle()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 5.0)
                continue
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at = max(next_at, time.monotonic()) + self.interval
            try:
                await self._send(*head)
            except Exception as e:  # the network, the server, the client: retry all
                self._note_failure(e)
                await self._reset()
                await self._sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
                continue
            with self._lock:
                if self._outbox and self._outbox[0] is head:
                    self._outbox.popleft()
            self.sent += 1
            backoff = BACKOFF_S[0]
            if self.failures:
                log.info(
                    "Supabase Realtime: publishing again after %d failed attempt(s)",
                    self.failures,
                )
                self.failures = 0

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        self._wake.clear()
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), deadline - time.monotonic())
            self._wake.clear()

    def _note_failure(self, e: BaseException) -> None:
        self.failures += 1
        self.last_error = describe(e)
        if self.failures == 1:
            log.warning(
                "Supabase Realtime: publishing to %s failed (%s); retrying with backoff."
                " Pages fall back to SSE meanwhile; nothing is lost (`crashdrill doctor"
                " supabase` checks the setup)",
                self.url,
                self.last_error,
            )
        else:
            log.debug("Supabase Realtime: attempt %d failed: %s", self.failures, self.last_error)

    async def _send(self, topic: str, text: str) -> None:
        channel = await self._channel(topic)
        # What channel.send_broadcast sends, pushed here so that its reply is awaited:
        # send_broadcast returns before Realtime acknowledges the message.
        payload = {"type": "broadcast", "event": self.event, "payload": json.loads(text)}
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

        def settle(result: str | None) -> None:
            if not done.done():
                done.set_result(result)

        push = await channel.push("broadcast", payload, ACK_TIMEOUT_S)
        push.receive("ok", lambda _r: settle(None))
        push.receive("error", lambda r: settle(f"Realtime refused the message: {r}"))
        push.receive("timeout", lambda: settle("no acknowledgement from Realtime in time"))
        problem = await asyncio.wait_for(done, ACK_TIMEOUT_S + 5)
        if problem is not None:
            raise PublishError(problem)
        self._used[topic] = time.monotonic()

    async def _channel(self, topic: str) -> Any:
        if self._client is None or not self._client.realtime.is_connected:
            await self._reset()
            self._client = await connect(self.project_url, self._key, ACK_TIMEOUT_S)
        channel = self._channels.get(topic)
        if channel is not None and channel.is_joined:
            return channel
        if len(self._channels) >= MAX_CHANNELS:
            oldest = min(self._channels, key=lambda t: self._used.get(t, 0.0))
            await self._leave(oldest)
        channel = self._client.channel(topic, channel_params(ack=True, private=self.private))
        outcome: list[str] = []
        await channel.subscribe(lambda state, err: outcome.append(f"{state.value} {err or ''}"))
        if not channel.is_joined:
            with contextlib.suppress(Exception):
                await self._client.remove_channel(channel)
            said = outcome[-1].strip() if outcome else "no reply"
            raise PublishError(f"joining {topic} failed: {said}")
        self._channels[topic] = channel
        self._used[topic] = time.monotonic()
        return channel

    async def _leave(self, topic: str) -> None:
        channel = self._channels.pop(topic, None)
        self._used.pop(topic, None)
        if channel is not None and self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.remove_channel(channel), 5)

    async def _leave_idle(self) -> None:
        now = time.monotonic()
        for topic in [t for t, used in self._used.items() if now - used > IDLE_LEAVE_S]:
            await self._leave(topic)

    async def _reset(self) -> None:
        """Drop the connection and every channel (the next send starts afresh)."""
        client, self._client = self._client, None
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.rejoin_timer.reset()
            channel.join_push.destroy()
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.realtime.close(), 5)


def describe(e: BaseException) -> str:
    """A short reason for a log line (never a key: URLs here carry none)."""
    text = str(e) or type(e).__name__
    if "apikey=" in text:
        text = text.split("apikey=")[0] + "apikey=…"
    return f"{type(e).__name__}: {text}"[:300]

"""The lab's front door: connections are bounded before they become requests (issue #24).

    limits = ConnectionLimits.fit(settings, open_files_limit())   # after raising the limit
    door = FrontDoor(limits)
    uvicorn.Config(app, host=…, port=…, **door.uvicorn_options(settings))

What uvicorn (0.54, httptools) does by itself, and what it cannot:
- `timeout_keep_alive` closes a connection idle *after* a response; any byte received
  cancels it, and nothing re-arms it until the next response is complete.
- nothing bounds how long a request takes to arrive: a connection that sends nothing, or
  `GET / HTTP/1.1\r\n` and then a byte every few seconds, is held for good;
- `limit_concurrency` answers 503 only once a request's headers are complete, so
  half-sent requests are never refused, and it counts every address alike;
- `h11_max_incomplete_event_size` bounds a header only under h11; httptools has no limit.

So every connection goes through `FrontDoor.protocol()`, a subclass of uvicorn's own
protocol class that adds: a per-address and a total cap at accept (503 and close, before
any parsing), a deadline by which each request (line, headers and body) must have
arrived, counted from the connection's start or from the first byte of the next request
on a kept-alive one (408 and close; never while bytes it sent wait unread: a lab whose
loop was late does not blame the client), a header byte limit, and uvicorn's keep-alive timer
re-armed where uvicorn leaves a connection without one. Refusals and closes are logged as
one summary line at most every 10 s, never a traceback. docs/server.md has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from crashdrill.server.settings_env import SettingsError

if TYPE_CHECKING:
    from crashdrill.server.settings import Settings

log = logging.getLogger("crashdrill.front_door")

MAX_HEADER_BYTES = 32 * 1024  # a request line and headers; browsers send ~1-2 KB here
# File descriptors kept out of the connections' reach: the database (SQLite and its WAL,
# or a Postgres socket), the warm trainer process, logging, the thread pool's reads and
# the telemetry sampler's /proc reads, and per run that may train at once its records and
# mirror files, the trainer's log files, pidfd and status socket and the mirror's copies.
FD_RESERVE_BASE = 256
FD_RESERVE_PER_RUN = 16
# A deadline that finds the request's bytes waiting unread (the lab's loop was late, not
# the client) is put off this long, at most this often, before it is judged again.
LATE_READ_GRACE_S = 1.0
MAX_LATE_READS = 30
MIN_CONNECTIONS = 16  # fewer than this left for connections: the lab refuses to start
REPORT_EVERY_S = 10.0


def open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; (soft, hard) now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        # macOS caps it at OPEN_MAX, a container may forbid it: keep what we have
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def files_open_now() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux
        return 64


def address_key(host: str) -> str:
    """What a connection counts against: its IPv4 address; an IPv6 client's /64 (one
    host gets a whole /64 and could otherwise open the cap once per address in it)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(frozen=True)
class ConnectionLimits:
    """The caps in force: the settings, fitted under the process's open-files limit."""

    max_connections: int
    max_per_address: int
    request_timeout_s: float
    keep_alive_s: float
    exempt: frozenset[str] = frozenset()  # trusted proxies: only the total counts them
    open_files: int = 0  # the soft limit they were fitted under
    reserved: int = 0  # descriptors kept for everything but connections

    @classmethod
    def fit(cls, settings: Settings, open_files: tuple[int, int]) -> ConnectionLimits:
        """The settings' caps, lowered (with a warning) to what the open-files limit
        allows after the reserve; SettingsError when fewer than MIN_CONNECTIONS remain."""
        soft = open_files[0]
        runs = settings.max_concurrent or settings.max_queued_runs
        reserved = files_open_now() + FD_RESERVE_BASE + FD_RESERVE_PER_RUN * runs
        room = soft - reserved
        if room < MIN_CONNECTIONS:
            raise SettingsError(
                f"the open-files limit is {soft} (hard {open_files[1]}) and the lab keeps"
                f" {reserved} for its database, runs and telemetry: {max(room, 0)} would be"
                f" left for connections, at least {MIN_CONNECTIONS} are needed; raise it"
                " (ulimit -n, or LimitNOFILE= / --ulimit nofile=) and start again"
            )
        total = settings.max_connections
        if total > room:
            log.warning(
                "max_connections = %d does not fit the open-files limit %d with %d kept"
                " for the lab itself: at most %d connections",
                total,
                soft,
                reserved,
                room,
            )
            total = room
        return cls(
            max_connections=total,
            max_per_address=min(settings.max_connections_per_address, total),
            request_timeout_s=settings.request_read_timeout_s,
            keep_alive_s=settings.keep_alive_timeout_s,
            exempt=frozenset(address_key(p) for p in settings.trusted_proxies),
            open_files=soft,
            reserved=reserved,
        )

    def describe(self) -> str:
        """For the start line: `at most 2000 connections (256 per address)`."""
        return f"at most {self.max_connections} connections ({self.max_per_address} per address)"


def _canned(status: str, text: str) -> bytes:
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status.startswith("503"):
        head += "retry-after: 5\r\n"
    return head.encode() + b"\r\n" + body


TOO_MANY_FROM_ADDRESS = _canned(
    "503 Service Unavailable",
    "the lab has too many connections open from your address; try again in a few seconds",
)
TOO_MANY = _canned(
    "503 Service Unavailable", "the lab has too many connections open; try again in a few seconds"
)
TOO_SLOW = _canned("408 Request Timeout", "the request did not arrive in time")
TOO_LARGE = _canned("431 Request Header Fields Too Large", "the request's headers are too large")


class FrontDoor:
    """Open connections by address, and the count of what was refused or closed, for one
    server (all on the event loop's thread)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self.by_address: Counter[str] = Counter()
        self.events: Counter[str] = Counter()  # since the last summary line
        self.totals: Counter[str] = Counter()
        self._last_report = float("-inf")
        self._report_due = False

    def admit(self, key: str) -> bytes | None:
        """None: the connection counts from now on; else the answer that refuses it."""
        if self.open >= self.limits.max_connections:
            self.note("refused: max_connections")
            return TOO_MANY
        if key not in self.limits.exempt and self.by_address[key] >= self.limits.max_per_address:
            self.note(f"refused: max_connections_per_address from {key}")
            return TOO_MANY_FROM_ADDRESS
        self.open += 1
        self.by_address[key] += 1
        return None

    def leave(self, key: str) -> None:
        self.open -= 1
        self.by_address[key] -= 1
        if self.by_address[key] <= 0:
            del self.by_address[key]

    def note(self, what: str) -> None:
        """Count an event; log a summary now, or within REPORT_EVERY_S."""
        self.events[what] += 1
        self.totals[what.split(" from ")[0]] += 1
        now = time.monotonic()
        if now - self._last_report >= REPORT_EVERY_S:
            self.report()
        elif not self._report_due:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # counted outside a server (tests): the next event reports
                return
            self._report_due = True
            loop.call_later(self._last_report + REPORT_EVERY_S - now, self.report)

    def report(self) -> None:
        self._report_due = False
        if not self.events:
            return
        self._last_report = time.monotonic()
        parts = ", ".join(f"{n} {what}" for what, n in self.events.most_common(6))
        log.warning(
            "front door: %s (open connections: %d of max_connections %d)",
            parts,
            self.open,
            self.limits.max_connections,
        )
        self.events.clear()

    def protocol(self, base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
        """uvicorn's HTTP protocol class (httptools, else h11) guarded by this door."""
        if base is None:
            try:
                from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

                base = HttpToolsProtocol
            except ImportError:
                from uvicorn.protocols.http.h11_impl import H11Protocol

                base = H11Protocol
        return type("GuardedHttpProtocol", (_Guard, base), {"door": self})

    def uvicorn_options(self, settings: Settings) -> dict[str, Any]:
        """Every uvicorn.Config option that concerns connections, set on purpose."""
        return {
            "http": self.protocol(),
            "ws": "none",  # the lab has no WebSocket routes: no upgrade path to attack
            "timeout_keep_alive": self.limits.keep_alive_s,
            # Our cap refuses at accept; uvicorn's (counted once headers are in) stays as
            # a backstop one above it, so a full door still answers its own requests.
            "limit_concurrency": self.limits.max_connections + 1,
            "backlog": settings.listen_backlog,
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES,  # used if h11 serves
        }


class _Guard:
    """Mixed in before uvicorn's protocol class (see FrontDoor.protocol)."""

    door: FrontDoor
    # uvicorn's attributes this relies on (both of its HTTP/1.1 protocols have them)
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    timeout_keep_alive: float
    timeout_keep_alive_task: asyncio.TimerHandle | None
    timeout_keep_alive_handler: Any

    _key = "?"
    _refused = False
    _deadline: asyncio.TimerHandle | None = None
    _cycle_at_start: Any = None  # the request cycle before the awaited request began
    _head_bytes = 0
    _head_tail = b""  # the last bytes of the head so far: its blank line may span two reads
    _got_bytes = False
    _late_reads = 0  # deadlines put off because the request's bytes were waiting unread

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._key = address_key(str(peer[0])) if isinstance(peer, tuple) else "local"
        refusal = self.door.admit(self._key)
        if refusal is not None:
            self._refused = True
            writer = cast(asyncio.WriteTransport, transport)  # uvloop's is not a subclass
            writer.write(refusal)
            writer.close()
            return
        super().connection_made(transport)  # type: ignore[misc]
        self._await_request(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.door.leave(self._key)
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._got_bytes = True
        before = self.cycle
        if self._deadline is None and (before is None or before.response_complete):
            self._await_request(before)  # the first byte of the next request
        if (
            self._deadline is not None
            and self.cycle is self._cycle_at_start
            and self._head_over_limit(data)
        ):
            # Before the parser sees it: a head that arrives whole in one read is
            # measured too, not only one still arriving.
            self._close(TOO_LARGE, "closed: headers over 32 KiB")
            return
        super().data_received(data)  # type: ignore[misc]
        if self._deadline is not None:
            cycle = self.cycle
            # headers are in, and the body: the request has arrived
            if cycle is not None and cycle is not self._cycle_at_start and not cycle.more_body:
                self._disarm()
        self._keep_alive_if_idle()

    def _head_over_limit(self, data: bytes) -> bool:
        """Count the bytes of `data` that belong to the request line and headers (up to
        the blank line that ends them; a body may follow in the same read); True once
        they are over MAX_HEADER_BYTES."""
        seen = self._head_tail + data
        ends = [i + len(m) for m in (b"\r\n\r\n", b"\n\n") if (i := seen.find(m)) >= 0]
        if ends:
            self._head_bytes += min(ends) - len(self._head_tail)
            self._head_tail = b""
        else:
            self._head_bytes += len(data)
            self._head_tail = seen[-3:]
        return self._head_bytes > MAX_HEADER_BYTES

    def _await_request(self, cycle_before: Any) -> None:
        self._disarm()
        self._cycle_at_start = cycle_before
        self._head_bytes = 0
        self._head_tail = b""
        self._deadline = self.loop.call_later(self.door.limits.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._unread_bytes() and self._late_reads < MAX_LATE_READS:
            # The bytes are here; the lab has not read them: its loop was busy (uvloop runs
            # due timers before the reads of the same turn). The client was in time: read
            # them first, and judge the request again a moment later.
            self._late_reads += 1
            self._deadline = self.loop.call_later(LATE_READ_GRACE_S, self._too_slow)
            return
        headers_in = self.cycle is not None and self.cycle is not self._cycle_at_start
        if not self._got_bytes:
            # Answered all the same: a client that was late (a starved machine) reads why
            # instead of "disconnected without a response"; a browser retries a 408 that
            # meets an unused socket it had opened ahead.
            self._close(TOO_SLOW, "closed: sent nothing within request_read_timeout_s")
        elif headers_in:  # the app is waiting for the body: it gets http.disconnect
            self._close(None, "closed: body not in within request_read_timeout_s")
        else:
            self._close(TOO_SLOW, "closed: request not in within request_read_timeout_s")

    def _unread_bytes(self) -> bool:
        """Bytes of this connection wait in the kernel, not yet read by the lab."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as peek:
                return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False

    def _close(self, answer: bytes | None, why: str) -> None:
        self.door.note(why)
        if self.transport.is_closing():
            return
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()

    def _keep_alive_if_idle(self) -> None:
        """uvicorn cancels its keep-alive timer on any byte and arms it again only when a
        response completes; bytes that finish a request whose response already went (a
        body the app did not read) would leave the connection with no timer at all."""
        cycle = self.cycle
        if (
            self._deadline is None
            and self.timeout_keep_alive_task is None
            and cycle is not None
            and cycle.response_complete
            and not self.transport.is_closing()
        ):
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

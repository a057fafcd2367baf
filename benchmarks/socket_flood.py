"""The slow-header / idle-socket flood of benchmarks/abuse.py (issue #24, item 1), run in a
child process of its own so that its socket work does not share the measuring process's
interpreter lock.

    child, results, stop = start_flood(port, sockets=2000, addresses=4, seconds=30)
    …; stop.set(); child.join(); summary = results.get()   # FloodSummary as a dict

The attacker keeps up to `sockets` connections open from `addresses` loopback addresses
(127.0.0.10, 127.0.0.11, …): half send `GET / HTTP/1.1\\r\\n` and nothing more, half send
nothing at all; each one the lab closes or refuses is opened again, at most
`MAX_CONNECTS_PER_S` a second, for `seconds` and then until `stop` is set (at most
EXTRA_S more: the measuring side sets it once its crash test is in). Every 0.5 s it counts the
sockets it holds: open for HELD_AFTER_S or longer and not refused (a refused one gets its
503 within milliseconds; one opened a moment ago may be about to). Loopback only, bounded
in count and time.
"""

from __future__ import annotations

import multiprocessing
import resource
import selectors
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

MAX_CONNECTS_PER_S = 1000
HALF = b"GET / HTTP/1.1\r\n"
HELD_AFTER_S = 1.0
EXTRA_S = 120.0


@dataclass(frozen=True)
class FloodSize:
    sockets: int
    addresses: int
    seconds: float

    def problem(self) -> str | None:
        """What is out of bounds (loopback only, bounded in count and time), or None."""
        if not 10 <= self.sockets <= 20000:
            return f"--flood-sockets {self.sockets}: 10 to 20000"
        if not 1 <= self.addresses <= 200:
            return f"--flood-addresses {self.addresses}: 1 to 200 (127.0.0.10 and up)"
        if not 5 <= self.seconds <= 600:
            return f"--flood-seconds {self.seconds}: 5 to 600"
        return None


@dataclass
class FloodSummary:
    sockets: int
    addresses: int
    seconds: float  # how long it flooded
    opened: int = 0
    connect_failed: int = 0
    refused_503: int = 0
    closed_408: int = 0
    closed_silently: int = 0
    held: list[int] = field(default_factory=list)  # sockets held, every 0.5 s

    def held_text(self) -> str:
        if not self.held:
            return "none sampled"
        return (
            f"max {max(self.held)}, mean {statistics.fmean(self.held):.0f},"
            f" at the end {self.held[-1]}"
        )


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def flood(
    port: int, sockets: int, addresses: int, seconds: float, stop: Event, out: Queue[Any]
) -> None:
    """The attacker's loop (in the child process); puts a FloodSummary dict on `out`."""
    _raise_open_files()
    summary = FloodSummary(sockets, addresses, seconds)
    sources = [f"127.0.0.{10 + i}" for i in range(addresses)]
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    opened_at: dict[socket.socket, float] = {}
    start = time.monotonic()
    at_least, at_most = start + seconds, start + seconds + EXTRA_S
    next_sample = time.monotonic() + 0.5
    budget = 0.0
    last = time.monotonic()
    while (now := time.monotonic()) < at_least or (now < at_most and not stop.is_set()):
        budget = min(budget + (now - last) * MAX_CONNECTS_PER_S, MAX_CONNECTS_PER_S / 10)
        last = now
        while len(got) < sockets and budget >= 1:
            budget -= 1
            s = socket.socket()
            s.settimeout(1.0)
            try:
                s.bind((sources[summary.opened % addresses], 0))
                s.connect(("127.0.0.1", port))
                if summary.opened % 2:
                    s.send(HALF)
            except OSError:
                summary.connect_failed += 1
                s.close()
                continue
            summary.opened += 1
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            got[s] = b""
            opened_at[s] = time.monotonic()
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj  # type: ignore[assignment]
            try:
                chunk = s.recv(4096)
            except OSError:
                chunk = b""
            got[s] += chunk
            if chunk:
                continue
            answer = got.pop(s)
            del opened_at[s]
            if answer.startswith(b"HTTP/1.1 503"):
                summary.refused_503 += 1
            elif answer.startswith(b"HTTP/1.1 408"):
                summary.closed_408 += 1
            else:
                summary.closed_silently += 1
            sel.unregister(s)
            s.close()
        if now >= next_sample:
            old = now - HELD_AFTER_S
            summary.held.append(
                sum(1 for s, a in got.items() if b" 503 " not in a and opened_at[s] <= old)
            )
            next_sample += 0.5
    summary.seconds = time.monotonic() - start
    for s in list(got):
        s.close()
    sel.close()
    out.put(asdict(summary))


def start_flood(
    port: int, sockets: int, addresses: int, seconds: float
) -> tuple[BaseProcess, Queue[Any], Event]:
    """The flood in a fresh child process (spawned: no threads of ours come along)."""
    ctx = multiprocessing.get_context("spawn")
    results: Queue[Any] = ctx.Queue()
    stop = ctx.Event()
    child = ctx.Process(
        target=flood, args=(port, sockets, addresses, seconds, stop, results), daemon=True
    )
    child.start()
    return child, results, stop

"""The lab's event stream as raw frames, for the benchmarks that time records on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator


class StreamRefused(OSError):
    """The server answered the stream request with another status than 200."""


def loopback_source(index: int, per_address: int) -> str:
    """The source address of client `index` when at most `per_address` clients share one:
    127.0.0.2, 127.0.0.3, … (the lab's stream and pair quotas are per address)."""
    n = 2 + index // per_address
    if n > 254:
        raise ValueError(f"client {index}: past 127.0.0.254 at {per_address} per address")
    return f"127.0.0.{n}"


async def sse_frames(
    port: int, pair: str, source: str | None = None
) -> AsyncIterator[tuple[bytes, float]]:
    """Complete frames of GET /api/stream?pair=PAIR on 127.0.0.1:PORT as they arrive, each
    batch with the time.time() its last chunk came; ends when the server closes. `source`:
    the loopback address this client connects from (default: the system's choice).
    Raises StreamRefused when the answer is not 200 (e.g. 429 past a per-address cap)."""
    local_addr = (source, 0) if source else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local_addr)
    try:
        writer.write(
            f"GET /api/stream?pair={pair} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise StreamRefused(status.decode(errors="replace"))
        buf = b""
        while chunk := await reader.read(65536):
            now = time.time()
            buf += chunk
            end = buf.rfind(b"\n\n")
            if end >= 0:
                frames, buf = buf[: end + 2], buf[end + 2 :]
                yield frames, now
    finally:
        writer.close()

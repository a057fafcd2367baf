"""The lab's event stream as raw frames, for the benchmarks that time records on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator


async def sse_frames(port: int, pair: str) -> AsyncIterator[tuple[bytes, float]]:
    """Complete frames of GET /api/stream?pair=PAIR on 127.0.0.1:PORT as they arrive, each
    batch with the time.time() its last chunk came; ends when the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /api/stream?pair={pair} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
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

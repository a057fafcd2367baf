"""A TCP proxy on loopback that delays every chunk, to stand in for a far-away server.

    with LatencyProxy(postgres_port, delay_s=0.015) as proxy:   # RTT + 30 ms
        url = f"postgresql://user:pw@127.0.0.1:{proxy.port}/db"

Each accepted connection opens one to 127.0.0.1:target_port (or another loopback
target). Both directions are pumped separately: a chunk read at time t is written on at
t + delay_s, in the order it was read, so one request and its reply cost 2 × delay_s more
than direct, and a stream of chunks is delayed, not slowed (they stay in flight
together, as on a long link with plenty of bandwidth). Bandwidth, loss and jitter are not
modelled. The proxy runs its own asyncio loop in a daemon thread; leaving the `with`
block closes the listener and every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from types import TracebackType

CHUNK_BYTES = 64 * 1024
START_TIMEOUT_S = 10
STOP_TIMEOUT_S = 10


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LatencyProxy:
    """Listens on 127.0.0.1:`port` (`listen_port`, or a free one) and forwards to
    target_host:target_port. Stopped and started again on the same `listen_port`, it
    stands for a database that went away and came back."""

    def __init__(
        self,
        target_port: int,
        delay_s: float = 0.0,
        target_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        if not 1 <= target_port <= 65535:
            raise ValueError(f"target_port = {target_port}: a number in 1..65535")
        if not 0 <= delay_s <= 10:
            raise ValueError(f"delay_s = {delay_s}: 0 to 10 seconds, one way")
        if not _is_loopback(target_host):
            raise ValueError(f"target_host = {target_host!r}: only loopback targets are allowed")
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = listen_port  # 0: a free one, set by start()
        self.connections = 0  # accepted so far
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LatencyProxy:
        """Listen; returns once `port` accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name=f"latency-proxy-{self.target_port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the proxy did not start within {START_TIMEOUT_S} s")
        if self._error is not None:
            self._thread.join(STOP_TIMEOUT_S)
            self._thread = None
            raise RuntimeError(f"the proxy could not listen: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then end the loop and its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._thread = None
        if thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(TimeoutError):
                done.result(STOP_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_S)

    def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, "127.0.0.1", self.port)
                )
            except OSError as e:
                self._error = e
                return
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._ready.set()
            loop.run_forever()
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _shutdown(self) -> None:
        """Close the listener and every socket: the pumps see the end of their streams
        and finish. (Cancelling a connection's task instead makes asyncio 3.11 log it.)"""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        if rest:
            _done, pending = await asyncio.wait(rest, timeout=self.delay_s + 1)
            for task in pending:  # e.g. one still connecting to the target
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: open the target's, pump both ways until both end."""
        self._writers.add(writer)
        self.connections += 1
        up_writer: asyncio.StreamWriter | None = None
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return  # the client sees its connection closed, as with a refused one
            self._writers.add(up_writer)
            both = (writer, up_writer)
            await asyncio.gather(
                self._pump(reader, up_writer, both), self._pump(up_reader, writer, both)
            )
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
                    self._writers.discard(w)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        """Read chunks as they come, write each delay_s after it was read, in order. An
        error on either side closes both sockets, which ends the other direction too."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, both))
        try:
            while True:
                try:
                    chunk = await reader.read(CHUNK_BYTES)
                except OSError:
                    chunk = b""
                queue.put_nowait((loop.time() + self.delay_s, chunk))
                if not chunk:  # end of stream: the sender half-closes after the delay
                    break
            await sender
        finally:
            sender.cancel()

    async def _send(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if writer.is_closing():
                    return
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
        except OSError:
            for w in both:
                w.close()

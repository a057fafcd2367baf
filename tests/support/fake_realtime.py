"""A test double (not shipped): a local endpoint that speaks Supabase Realtime's documented
wire protocol, for the contract, doctor and browser tests.

    with FakeRealtime() as fake:          # ws://127.0.0.1:PORT/realtime/v1/websocket
        settings = Settings(supabase_url=fake.url, supabase_anon_key=ANON_KEY, ...)
        ...
        fake.broadcasts("crashdrill:pair:ID")   # what the server published, in order

The protocol is Phoenix channels over a websocket at /realtime/v1/websocket?apikey=KEY&
vsn=1.0.0 (messages are JSON objects {topic, event, payload, ref, join_ref}) or vsn=2.0.0
(the same as arrays [join_ref, ref, topic, event, payload], what supabase-js speaks):

- the upgrade is refused with HTTP 401 when `apikey` is not one of the project's keys;
- `phx_join` on "realtime:TOPIC" with payload {config: {broadcast: {ack, self}, presence,
  private}, access_token} is answered by `phx_reply` {status: ok, response:
  {postgres_changes: []}}, or {status: error, response: {reason}} when the join is refused
  (a private channel the anon role may not read, or `join_error` set by the test);
- `heartbeat` on topic "phoenix" is answered ok;
- `broadcast` with payload {type: "broadcast", event, payload} on a joined topic is
  relayed to the topic's other members (and to the sender when config.broadcast.self),
  and answered ok when the sender joined with config.broadcast.ack;
- `phx_leave` is answered ok.

Every broadcast received is recorded with its raw frame size and arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.support.extras import require_extra

ANON_KEY = "anon-key-for-tests"
SERVICE_KEY = "service-key-for-tests-SECRET"
PATH = "/realtime/v1/websocket"


@dataclass
class Broadcast:
    topic: str  # without the "realtime:" prefix
    event: str
    payload: Any
    frame_bytes: int  # the whole websocket frame as received
    role: str  # "anon" or "service": the key the sender joined with
    t: float = field(default_factory=time.monotonic)


@dataclass
class _Member:
    conn: ServerConnection
    v2: bool
    role: str
    join_ref: str | None
    ack: bool
    echo: bool


class FakeRealtime:
    def __init__(
        self,
        *,
        anon_key: str = ANON_KEY,
        service_key: str = SERVICE_KEY,
        anon_may_read_private: bool = True,
        join_error: str | None = None,
        port: int = 0,
    ) -> None:
        self.keys = {anon_key: "anon", service_key: "service"}
        self.anon_may_read_private = anon_may_read_private
        self.join_error = join_error
        self.port = port
        self.received: list[Broadcast] = []
        self.joins: list[tuple[str, str, bool]] = []  # (topic, role, private)
        self.refused: list[int] = []  # HTTP statuses of refused upgrades
        self._members: dict[str, dict[ServerConnection, _Member]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """The project URL, as in SUPABASE_URL."""
        return f"http://127.0.0.1:{self.port}"

    # ---- what the tests read --------------------------------------------------------

    def broadcasts(self, topic: str | None = None) -> list[Broadcast]:
        with self._lock:
            return [b for b in self.received if topic is None or b.topic == topic]

    def members(self, topic: str) -> int:
        with self._lock:
            return len(self._members.get(topic, {}))

    def publish(self, topic: str, event: str, payload: Any) -> None:
        """Broadcast to every member of `topic`, as if another client had sent it."""
        loop = self._loop
        assert loop is not None, "not started"
        body = {"type": "broadcast", "event": event, "payload": payload}

        async def send() -> None:
            with self._lock:
                members = list(self._members.get(topic, {}).values())
            for m in members:
                await self._send(m.conn, m.v2, None, None, f"realtime:{topic}", "broadcast", body)

        asyncio.run_coroutine_threadsafe(send(), loop).result(10)

    # ---- start and stop -------------------------------------------------------------

    def __enter__(self) -> FakeRealtime:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        require_extra("supabase")  # what talks to it is Supabase's own client
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Realtime endpoint did not start")

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self, ready: threading.Event) -> None:
        asyncio.run(self._main(ready))

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(
            self._handle, "127.0.0.1", self.port, process_request=self._check_request
        ) as server:
            self._server = server
            self.port = next(iter(server.sockets)).getsockname()[1]
            ready.set()
            await self._stop.wait()

    # ---- the protocol ---------------------------------------------------------------

    def _check_request(self, _conn: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path != PATH:
            return self._refuse(HTTPStatus.NOT_FOUND, {"message": "no Route matched"})
        key = parse_qs(url.query).get("apikey", [""])[0]
        if key not in self.keys:
            return self._refuse(HTTPStatus.UNAUTHORIZED, {"message": "Invalid API key"})
        return None

    def _refuse(self, status: HTTPStatus, body: dict[str, str]) -> Response:
        self.refused.append(int(status))
        data = json.dumps(body).encode()
        headers = Headers(
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        )
        return Response(int(status), status.phrase, headers, data)

    async def _handle(self, conn: ServerConnection) -> None:
        query = parse_qs(urlsplit(conn.request.path if conn.request else "").query)
        v2 = query.get("vsn", ["1.0.0"])[0].startswith("2")
        role = self.keys.get(query.get("apikey", [""])[0], "anon")
        try:
            async for raw in conn:
                text = raw if isinstance(raw, str) else raw.decode()
                await self._on_frame(conn, v2, role, text)
        except ConnectionClosed:
            pass
        finally:
            with self._lock:
                for members in self._members.values():
                    members.pop(conn, None)

    async def _on_frame(self, conn: ServerConnection, v2: bool, role: str, text: str) -> None:
        msg = json.loads(text)
        if v2:
            join_ref, ref, topic, event, payload = msg
        else:
            join_ref, ref = msg.get("join_ref"), msg.get("ref")
            topic, event, payload = msg["topic"], msg["event"], msg.get("payload") or {}
        name = topic.removeprefix("realtime:")
        if event == "heartbeat":
            await self._send(conn, v2, None, ref, "phoenix", "phx_reply", _ok({}))
        elif event == "phx_join":
            await self._join(conn, v2, role, join_ref, ref, topic, payload)
        elif event == "phx_leave":
            with self._lock:
                self._members.get(name, {}).pop(conn, None)
            await self._send(conn, v2, join_ref, ref, topic, "phx_reply", _ok({}))
        elif event == "broadcast":
            with self._lock:
                members = dict(self._members.get(name, {}))
            sender = members.get(conn)
            if sender is None:
                return  # Realtime ignores broadcasts on a topic the socket has not joined
            with self._lock:
                self.received.append(
                    Broadcast(name, payload.get("event"), payload.get("payload"), len(text), role)
                )
            for other in members.values():
                if other.conn is not conn or sender.echo:
                    await self._send(other.conn, other.v2, None, None, topic, "broadcast", payload)
            if sender.ack:
                await self._send(conn, v2, join_ref, ref, topic, "phx_reply", _ok({}))

    async def _join(
        self,
        conn: ServerConnection,
        v2: bool,
        role: str,
        join_ref: str | None,
        ref: str | None,
        topic: str,
        payload: dict[str, Any],
    ) -> None:
        name = topic.removeprefix("realtime:")
        config = payload.get("config") or {}
        private = bool(config.get("private"))
        token_role = self.keys.get(payload.get("access_token") or "", role)
        reason = self.join_error
        if reason is None and private and token_role == "anon" and not self.anon_may_read_private:
            reason = (
                "Unauthorized: You do not have permissions to read from this Channel topic: " + name
            )
        if reason is not None:
            reply = {"status": "error", "response": {"reason": reason}}
            await self._send(conn, v2, join_ref, ref, topic, "phx_reply", reply)
            return
        broadcast = config.get("broadcast") or {}
        member = _Member(
            conn,
            v2,
            token_role,
            join_ref or ref,
            bool(broadcast.get("ack")),
            bool(broadcast.get("self")),
        )
        with self._lock:
            self._members.setdefault(name, {})[conn] = member
            self.joins.append((name, token_role, private))
        await self._send(conn, v2, join_ref, ref, topic, "phx_reply", _ok({"postgres_changes": []}))

    async def _send(
        self,
        conn: ServerConnection,
        v2: bool,
        join_ref: str | None,
        ref: str | None,
        topic: str,
        event: str,
        payload: dict[str, Any],
    ) -> None:
        if v2:
            frame = json.dumps([join_ref, ref, topic, event, payload])
        else:
            frame = json.dumps(
                {
                    "topic": topic,
                    "event": event,
                    "payload": payload,
                    "ref": ref,
                    "join_ref": join_ref,
                }
            )
        with contextlib.suppress(ConnectionClosed):
            await conn.send(frame)


def _ok(response: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "response": response}


def main() -> None:  # pragma: no cover - for trying the page by hand
    import argparse

    parser = argparse.ArgumentParser(description="a local Supabase Realtime stand-in")
    parser.add_argument("--port", type=int, default=54321)
    args = parser.parse_args()
    with FakeRealtime(port=args.port) as fake:
        print(f"SUPABASE_URL={fake.url} SUPABASE_ANON_KEY={ANON_KEY}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()

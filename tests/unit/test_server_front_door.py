"""server/door/front_door.py without a server: who is admitted, how the caps fit the open-files
limit, and the settings that set them (the protocol itself is driven over real sockets in
tests/integration/test_front_door.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from crashdrill.server import serve_cli
from crashdrill.server.door.front_door import (
    FD_RESERVE_BASE,
    TOO_MANY,
    TOO_MANY_FROM_ADDRESS,
    ConnectionLimits,
    FrontDoor,
    address_key,
)
from crashdrill.server.settings import Settings, SettingsError
from tests.support.lab import free_port


def door(total: int = 10, per_address: int = 3, exempt: frozenset[str] = frozenset()) -> FrontDoor:
    return FrontDoor(ConnectionLimits(total, per_address, 10.0, 5.0, exempt=exempt))


def test_a_connection_past_its_address_s_cap_is_refused_while_other_addresses_get_in() -> None:
    d = door()
    assert [d.admit("127.0.0.2") for _ in range(3)] == [None, None, None]
    assert d.admit("127.0.0.2") == TOO_MANY_FROM_ADDRESS
    assert d.admit("127.0.0.3") is None  # loopback addresses count separately
    d.leave("127.0.0.2")
    assert d.admit("127.0.0.2") is None  # a closed one frees its place
    assert d.open == 4 and d.by_address == {"127.0.0.2": 3, "127.0.0.3": 1}


def test_the_total_cap_refuses_every_address_and_a_trusted_proxy_counts_only_there() -> None:
    d = door(total=5, per_address=2, exempt=frozenset({"10.0.0.9"}))
    assert [d.admit("10.0.0.9") for _ in range(4)] == [None] * 4  # the proxy: past 2
    assert d.admit("127.0.0.2") is None
    assert d.admit("127.0.0.3") == TOO_MANY
    assert d.admit("10.0.0.9") == TOO_MANY
    assert d.totals == {"refused: max_connections": 2}


def test_refusals_are_answered_with_a_complete_http_response_that_closes() -> None:
    for answer in (TOO_MANY, TOO_MANY_FROM_ADDRESS):
        head, body = answer.split(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head
        assert f"content-length: {len(body)}".encode() in head and b"retry-after: 5" in head


def test_an_ipv6_client_counts_by_its_64_and_an_ipv4_one_by_its_address() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("127.0.0.2") != address_key("127.0.0.3")


def test_the_caps_are_lowered_to_fit_the_open_files_limit_after_the_reserve(
    tmp_path: Path,
) -> None:
    s = Settings(data_dir=tmp_path, max_concurrent=2, max_connections=5000)
    limits = ConnectionLimits.fit(s, (1024, 1024))
    assert limits.reserved >= FD_RESERVE_BASE + 2 * 16
    assert limits.max_connections == 1024 - limits.reserved
    assert limits.max_per_address == min(256, limits.max_connections)
    roomy = ConnectionLimits.fit(s, (1 << 20, 1 << 20))
    assert (roomy.max_connections, roomy.max_per_address) == (5000, 256)


def test_an_open_files_limit_that_leaves_no_room_for_connections_is_refused(
    tmp_path: Path,
) -> None:
    s = Settings(data_dir=tmp_path, max_concurrent=2)
    with pytest.raises(SettingsError, match=r"open-files limit is 300 .*ulimit -n"):
        ConnectionLimits.fit(s, (300, 300))


def test_the_server_raises_its_soft_open_files_limit_to_the_hard_one() -> None:
    code = (
        "import resource\n"
        "from crashdrill.server.door.front_door import open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(open_files_limit() == (hard, hard))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_connections": 8}, r"max_connections = 8: 16 to 1000000"),
        ({"max_connections_per_address": 0}, r"max_connections_per_address = 0: 1 to"),
        (
            {"max_connections": 100, "max_connections_per_address": 101},
            r"max_connections_per_address = 101: 1 to max_connections \(100\)",
        ),
        ({"request_read_timeout_s": 0.0}, r"request_read_timeout_s = 0.0: 0.5 to 300 seconds"),
        ({"keep_alive_timeout_s": float("nan")}, r"keep_alive_timeout_s = nan: 0.5 to 300"),
        ({"listen_backlog": 1}, r"listen_backlog = 1: 16 to 65535"),
    ],
)
def test_bad_connection_settings_name_the_field_and_what_is_allowed(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings(data_dir=tmp_path, **changes)  # type: ignore[arg-type]


def test_connection_settings_come_from_the_environment_then_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CRASHDRILL_MAX_CONNECTIONS", "900")
    monkeypatch.setenv("CRASHDRILL_MAX_CONNECTIONS_PER_ADDRESS", "40")
    monkeypatch.setenv("CRASHDRILL_REQUEST_READ_TIMEOUT_S", "4.5")
    monkeypatch.setenv("CRASHDRILL_KEEP_ALIVE_TIMEOUT_S", "2")
    monkeypatch.setenv("CRASHDRILL_LISTEN_BACKLOG", "64")
    s = Settings.from_env(data_dir=tmp_path, max_connections_per_address=30)
    assert (s.max_connections, s.max_connections_per_address) == (900, 30)
    assert (s.request_read_timeout_s, s.keep_alive_timeout_s, s.listen_backlog) == (4.5, 2.0, 64)
    monkeypatch.setenv("CRASHDRILL_MAX_CONNECTIONS", "lots")
    with pytest.raises(SettingsError, match="CRASHDRILL_MAX_CONNECTIONS = 'lots': a whole"):
        Settings.from_env(data_dir=tmp_path)


def test_serve_refuses_a_bad_connection_flag_with_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers()).set_defaults(func=serve_cli.run)
    args = parser.parse_args(
        ["serve", "--data-dir", str(tmp_path), "--request-read-timeout", "0.1"]
    )
    assert args.func(args) == 2
    assert "request_read_timeout_s = 0.1: 0.5 to 300 seconds" in capsys.readouterr().err


def test_uvicorn_takes_the_door_s_options_and_serves_with_its_guarded_protocol(
    tmp_path: Path,
) -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    settings = Settings(data_dir=tmp_path, listen_backlog=64)
    d = FrontDoor(ConnectionLimits.fit(settings, (1 << 20, 1 << 20)))

    async def app(scope: object, receive: object, send: object) -> None:  # never called
        raise AssertionError

    config = uvicorn.Config(app, **d.uvicorn_options(settings))
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)
    assert config.http_protocol_class.door is d  # type: ignore[attr-defined]
    assert config.ws_protocol_class is None and config.backlog == 64
    assert config.limit_concurrency == d.limits.max_connections + 1


# ---- a real uvicorn behind the door (an app that answers 200, guarded as the lab's is)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[int]:
    """A port on 127.0.0.1 where uvicorn serves, through the door and the lab's browser
    guard (the Host check), an app that answers every request it gets with 200."""
    with serve_guarded(tmp_path) as port:
        yield port


@contextlib.contextmanager
def serve_guarded(tmp_path: Path, **settings_changes: Any) -> Iterator[int]:
    """The `guarded` server, with these settings changed."""
    from crashdrill.server.door.browser_guard import BrowserGuardMiddleware

    async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    settings = Settings(data_dir=tmp_path, port=port, **settings_changes)
    d = FrontDoor(ConnectionLimits.fit(settings, (1 << 20, 1 << 20)))
    app = BrowserGuardMiddleware(ok, settings=settings)  # type: ignore[arg-type]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    for name, value in d.uvicorn_options(settings).items():
        setattr(config, name, value)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def answer(port: int, request: bytes) -> bytes:
    """The status line the server answers `request` (sent in one write) with."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        got = b""
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    return got.split(b"\r\n", 1)[0]


def with_header_of(size: int) -> bytes:
    head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
    return head + b"a" * (size - len(head) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("kib", [33, 100])
def test_headers_over_32_kib_are_431_even_when_they_arrive_in_one_read(
    guarded: int, kib: int
) -> None:
    assert (
        answer(guarded, with_header_of(kib * 1024))
        == b"HTTP/1.1 431 Request Header Fields Too Large"
    )


def test_headers_under_32_kib_and_a_large_body_after_them_are_served(guarded: int) -> None:
    assert answer(guarded, with_header_of(31 * 1024)) == b"HTTP/1.1 200 OK"
    body = b"x" * (200 * 1024)  # in the same write as the head: the body is not a header
    head = f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    assert answer(guarded, head.encode() + body) == b"HTTP/1.1 200 OK"


def test_an_http_1_1_request_without_host_is_400_and_an_http_1_0_one_passes(guarded: int) -> None:
    assert answer(guarded, b"GET / HTTP/1.1\r\n\r\n") == b"HTTP/1.1 400 Bad Request"
    assert answer(guarded, b"GET / HTTP/1.0\r\n\r\n") == b"HTTP/1.1 200 OK"
    assert answer(guarded, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") == b"HTTP/1.1 200 OK"


def test_a_connection_that_sends_nothing_in_time_is_answered_408_before_it_is_closed(
    tmp_path: Path,
) -> None:
    """A student whose client was late (a starved machine) must read why, not "Server
    disconnected without sending a response" (issue 38: a connection is never dropped
    without an answer)."""
    with (
        serve_guarded(tmp_path, request_read_timeout_s=0.5) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as s,
    ):
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert got.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), got
    assert b"did not arrive in time" in got


def test_an_idle_connection_is_closed_by_the_client_before_the_server_closes_it() -> None:
    """A server that closes an idle connection just as the client reuses it drops that
    request unanswered ("Server disconnected without sending a response", issue 38): its
    keep-alive outlasts the clients' own idle expiry (httpx's default pool: 5 s)."""
    import httpx

    pool = httpx.AsyncHTTPTransport()._pool  # what a student's httpx client keeps
    assert pool._keepalive_expiry is not None
    assert Settings().keep_alive_timeout_s > 2 * pool._keepalive_expiry


def test_a_request_sent_in_time_is_answered_when_the_lab_s_loop_was_late_to_read_it(
    tmp_path: Path,
) -> None:
    """A lab whose event loop stalls past request_read_timeout_s (a CPU-starved machine)
    found the deadline before the bytes: uvloop runs due timers before the reads of the
    same turn, and the connection was closed unanswered ("sent nothing"). The door
    now reads what is waiting first (issue 38)."""
    import socket
    import threading
    import time

    settings = Settings(data_dir=tmp_path, request_read_timeout_s=0.5)
    d = FrontDoor(ConnectionLimits.fit(settings, (1 << 20, 1 << 20)))

    async def app(scope: dict[str, Any], receive: object, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        log_level="error",
        **d.uvicorn_options(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the test server never started"
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port)) as c:
            time.sleep(0.2)  # accepted: the door's deadline runs
            # Stall the server's loop past the deadline inside an I/O callback (as a
            # starved process is stopped anywhere), and send the request meanwhile.
            stalled = threading.Event()
            loop = server.servers[0].get_loop()
            r, w = os.pipe()

            def stall() -> None:
                loop.remove_reader(r)
                stalled.set()
                time.sleep(1.5)

            loop.call_soon_threadsafe(loop.add_reader, r, stall)
            time.sleep(0.1)
            os.write(w, b"x")
            assert stalled.wait(5)
            c.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            c.settimeout(10)
            got = b""
            while chunk := c.recv(4096):
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got
    finally:
        server.should_exit = True
        thread.join(10)

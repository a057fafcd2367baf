"""The front-door section of the settings: who may reach the lab and how many
connections they hold (server/door/front_door.py, server/door/allowed_hosts.py,
server/door/forwarded.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from crashdrill.server.setting_schema import (
    NAMES,
    NUMBER,
    SWITCH,
    WHOLE,
    between,
    names,
    other_variables,
    setting,
)

ALLOWED_HOSTS_VARIABLE = "CRASHDRILL_ALLOWED_HOSTS"


def allowed_hosts_from_environ() -> tuple[str, ...]:
    """CRASHDRILL_ALLOWED_HOSTS: host names, separated by commas or spaces (the
    `allowed_hosts` default, so a Settings built in code reads it too)."""
    return names(os.environ.get(ALLOWED_HOSTS_VARIABLE, ""))


@dataclass(frozen=True)
class FrontDoorSection:
    """Who may reach the lab and how many connections they hold (server/door/front_door.py,
    server/door/allowed_hosts.py, server/door/forwarded.py)."""

    TITLE = "The front door"
    OTHER_VARIABLES = other_variables()

    https: bool = setting(
        False,
        default_text="off",
        parse=SWITCH,
        env="CRASHDRILL_HTTPS",
        what="the lab is served over https: cookies get `Secure`",
    )
    trusted_proxies: tuple[str, ...] = setting(
        (),
        default_text="none",
        parse=NAMES,
        env="CRASHDRILL_TRUSTED_PROXIES",
        what="addresses of reverse proxies whose `X-Forwarded-For`, `-Proto` and `-Host` are"
        " believed (comma-separated); the compose stack sets its nginx's address alone"
        " ([docker.md](docker.md#the-proxy))",
    )
    # Host names beyond loopback names, IP addresses and `host` (DNS rebinding); "*": off.
    allowed_hosts: tuple[str, ...] = setting(
        factory=allowed_hosts_from_environ,
        default_text="none: `localhost`, IP addresses and `host` only",
        parse=NAMES,
        env=ALLOWED_HOSTS_VARIABLE,
        env_read_by_default=True,
        flag="--allowed-hosts",
        metavar="NAMES",
        how_note="(names, comma-separated)",
        help="host names the lab answers to besides localhost and IP addresses,"
        " comma-separated (lab.example.org; default: CRASHDRILL_ALLOWED_HOSTS); other names"
        " get 400",
        what="other names the lab answers to (`lab.example.org`, no port); any other `Host`"
        " gets 400 ([browsers](#browsers)); `*` turns the check off, for a proxy that"
        " checks names itself",
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        default_text="none (the lab's own origin only)",
        parse=NAMES,
        env="CRASHDRILL_ALLOWED_ORIGINS",
        what="other origins (`https://host[:port]`) whose pages may send state-changing requests",
    )
    max_connections: int = setting(
        2000,
        default_text="2000, lowered to fit the open-files limit",
        parse=WHOLE,
        env="CRASHDRILL_MAX_CONNECTIONS",
        flag="--max-connections",
        allowed=between(16, 1_000_000),
        help="connections open at once, all addresses (default 2000, lowered to fit the"
        " open-files limit)",
        what="connections open at once from all addresses (16 to 1000000); past it a new one"
        " gets 503 and is closed ([the front door](#the-front-door))",
    )
    # A class of 60 behind one NAT uses ~120-200.
    max_connections_per_address: int = setting(
        256,
        parse=WHOLE,
        env="CRASHDRILL_MAX_CONNECTIONS_PER_ADDRESS",
        flag="--max-connections-per-address",
        help="connections open at once from one client address (default 256)",
        what="connections open at once from one client address (an IPv6 client: its /64), 1"
        " to `max_connections`; past it 503 and closed. Peers in `trusted_proxies` count"
        " only in the total",
    )
    request_read_timeout_s: float = setting(
        10.0,
        default_text="10",
        parse=NUMBER,
        env="CRASHDRILL_REQUEST_READ_TIMEOUT_S",
        flag="--request-read-timeout",
        metavar="SECONDS",
        allowed=between(0.5, 300, "0.5 to 300 seconds"),
        help="a request's line, headers and body must arrive within this (default 10)",
        what="a request's line, headers and body must have arrived this long after the"
        " connection opened or the request's first byte (0.5 to 300); else 408 and closed",
    )
    # Longer than the clients' own idle expiry (httpx 5 s, aiohttp 15 s), so that the
    # client, never the server, closes an idle one: a server that closes it as the client
    # reuses it drops that request unanswered.
    keep_alive_timeout_s: float = setting(
        75.0,
        default_text="75",
        parse=NUMBER,
        env="CRASHDRILL_KEEP_ALIVE_TIMEOUT_S",
        flag="--keep-alive-timeout",
        metavar="SECONDS",
        allowed=between(0.5, 300, "0.5 to 300 seconds"),
        help="close a connection idle this long after a response (default 75)",
        what="a connection idle this long after a response is closed (0.5 to 300); longer"
        " than clients' own idle expiry (httpx 5 s, aiohttp 15 s) so that the client closes"
        " an idle connection first: at 5 s a client reusing a connection just as the server"
        ' closed it got "Server disconnected without sending a response" (issue 38)',
    )
    listen_backlog: int = setting(
        256,
        parse=WHOLE,
        env="CRASHDRILL_LISTEN_BACKLOG",
        flag="--listen-backlog",
        allowed=between(16, 65535),
        help="connections the kernel queues before the lab accepts them (default 256)",
        what="connections the kernel queues for the lab to accept (16 to 65535; the kernel's"
        " `net.core.somaxconn` caps it)",
    )

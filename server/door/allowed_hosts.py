"""The names the lab answers to: a guard against DNS rebinding.

    refusal = host_refusal(scope, settings)   # None, or the sentence of a 400

A page on attacker.example can have its name re-pointed at 127.0.0.1 after it loaded
("DNS rebinding"): the browser then sends the page's requests to the lab as same-origin
ones, `Host: attacker.example:8000` with a matching `Origin`, and reads the answers. So
before anything else (the Origin check included) the lab looks at the name the browser
used — the Host header, or X-Forwarded-Host from a proxy in `trusted_proxies` — and
answers 400 unless it is

- a loopback name: `localhost` (and `*.localhost`), whatever the port;
- an IP address (127.0.0.1, ::1, a LAN address): a name no DNS answer can re-point;
- the `host` setting (what `--host` binds), or a name in `allowed_hosts`
  (CRASHDRILL_ALLOWED_HOSTS: the names a class uses, like lab.example.org); `*` in it
  turns the check off, for a reverse proxy that checks names itself.

An HTTP/1.1 request without a Host header is malformed (RFC 9112, section 3.2) and gets
400 too; one over HTTP/1.0 (a script) may go without and passes, as no browser sends it.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.types import Scope

from crashdrill.server.door.forwarded import request_host
from crashdrill.server.settings import Settings

_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_HOST_HEADER = re.compile(r"(?P<name>\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+)(:(?P<port>[0-9]{1,5}))?")
ANY = "*"


def host_name_problem(name: str) -> str | None:
    """Why `name` cannot be an entry of `allowed_hosts`; None when it can."""
    if name == ANY or _is_address(name):
        return None
    if ":" in name or "/" in name:
        return "is not a host name: give the name alone, without scheme or port (lab.example.org)"
    if not _NAME.fullmatch(name.lower().rstrip(".")):
        return "is not a host name: letters, digits, '-', '_' and '.' (lab.example.org)"
    return None


def name_of(host: str) -> str | None:
    """The name in a Host header, lower case, without port or trailing dot
    ('Lab.Example.:8000' → 'lab.example', '[::1]:8000' → '::1'); None when malformed."""
    match = _HOST_HEADER.fullmatch(host.strip())
    if match is None:
        return None
    return match["name"].strip("[]").rstrip(".").lower() or None


def host_allowed(name: str, settings: Settings) -> bool:
    if ANY in settings.allowed_hosts or _is_address(name):
        return True
    if name == "localhost" or name.endswith(".localhost"):
        return True
    allowed = {n.lower().rstrip(".") for n in (*settings.allowed_hosts, settings.host)}
    return name in allowed


def host_refusal(scope: Scope, settings: Settings) -> str | None:
    """None when the request's host is one the lab answers to; else why not, for a 400."""
    host = request_host(scope, settings)
    if host is None:
        if scope.get("http_version") == "1.1" and not _has_host_header(scope):
            return (
                "an HTTP/1.1 request needs a Host header (RFC 9112, section 3.2): the name"
                " the lab was reached by, such as 127.0.0.1:8000"
            )
        return None  # HTTP/1.0, not sent by a browser
    name = name_of(host)
    if name is not None and host_allowed(name, settings):
        return None
    shown = host[:100]
    return (
        f"Host {shown!r} is not a name of this lab (a page that reached the lab under"
        " another name may be a DNS rebinding attack): the lab answers to localhost, IP"
        " addresses and the names in CRASHDRILL_ALLOWED_HOSTS (comma-separated, e.g."
        " lab.example.org)"
    )


def _has_host_header(scope: Scope) -> bool:
    return any(name == b"host" for name, _ in scope.get("headers", ()))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True

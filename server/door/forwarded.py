"""Who a request comes from and how it reached the lab, believing a proxy only when told to.

    client_address(scope, settings)   # "203.0.113.7": the peer, or what a trusted proxy says
    served_over_https(scope, settings) # True: cookies get Secure
    request_host(scope, settings)     # "lab.example.org:8000": the name the browser used
    request_origin(scope, settings)   # "https://lab.example.org": the lab's own origin

Behind a reverse proxy every request comes from the proxy's address, so per-address limits
(token guesses, event streams) would count the whole class as one client, and the proxy
says in X-Forwarded-Proto whether the browser used https. The lab believes X-Forwarded-For
and X-Forwarded-Proto only from the addresses in the `trusted_proxies` setting
(CRASHDRILL_TRUSTED_PROXIES); from anyone else they are ignored, since anyone can send them.
"""

from __future__ import annotations

from starlette.types import Scope

from crashdrill.server.settings import Settings


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "?"


def _from_trusted_proxy(scope: Scope, settings: Settings) -> bool:
    return bool(settings.trusted_proxies) and _peer(scope) in settings.trusted_proxies


def client_address(scope: Scope, settings: Settings) -> str:
    """The client's address: the peer's, or, from a trusted proxy, the nearest address in
    X-Forwarded-For that is not itself a trusted proxy."""
    peer = _peer(scope)
    if not _from_trusted_proxy(scope, settings):
        return peer
    forwarded = _header(scope, b"x-forwarded-for") or ""
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in settings.trusted_proxies:
            return hop
    return peer


def served_over_https(scope: Scope, settings: Settings) -> bool:
    """The `https` setting, or a trusted proxy saying X-Forwarded-Proto: https."""
    if settings.https or scope.get("scheme") == "https":
        return True
    if _from_trusted_proxy(scope, settings):
        proto = (_header(scope, b"x-forwarded-proto") or "").split(",")[0].strip().lower()
        return proto == "https"
    return False


def request_host(scope: Scope, settings: Settings) -> str | None:
    """The host[:port] the browser used to reach the lab: the Host header (X-Forwarded-Host
    from a trusted proxy); None without one."""
    host = _header(scope, b"host")
    if _from_trusted_proxy(scope, settings):
        host = (_header(scope, b"x-forwarded-host") or host or "").split(",")[0].strip() or host
    return host or None


def request_origin(scope: Scope, settings: Settings) -> str | None:
    """The origin the browser used to reach the lab (scheme://host[:port]), from
    request_host; None without one."""
    host = request_host(scope, settings)
    if not host:
        return None
    scheme = "https" if served_over_https(scope, settings) else "http"
    return f"{scheme}://{host.lower()}"

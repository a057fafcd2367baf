"""What a browser must not be tricked into: DNS rebinding, cross-origin state changes,
framing, sniffing.

    app.add_middleware(BrowserGuardMiddleware, settings=settings)

- Any request whose Host (X-Forwarded-Host from a trusted proxy) is not a name the lab
  answers to gets 400 first, before the Origin check: a page whose name was re-pointed at
  the lab would otherwise pass it as same-origin (server/door/allowed_hosts.py).
- A POST, PUT, PATCH or DELETE whose Origin (else Referer) names another origin than the
  lab's own or one of the `allowed_origins` setting is refused with 403 before any route
  runs: another site's page cannot start pairs, crash runs or log an instructor in with a
  browser's cookies. A request with neither header (curl, scripts, the tests' clients) is
  not a browser's cross-site request and passes; `Origin: null` (a sandboxed frame, a
  file: page) is refused.
- Every response carries a Content-Security-Policy (scripts and styles only from the lab
  itself, plus the Supabase Realtime endpoint when it is configured; no inline script or
  style; `frame-ancestors 'none'`), X-Frame-Options: DENY, X-Content-Type-Options: nosniff
  and Referrer-Policy: same-origin. The OpenAPI pages (/docs, /redoc) load their viewer
  from a CDN with an inline bootstrap, so they get a policy of their own that allows those.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crashdrill.server.door.allowed_hosts import host_refusal
from crashdrill.server.door.forwarded import request_origin
from crashdrill.server.settings import Settings

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
API_DOC_PAGES = ("/docs", "/redoc")
API_DOC_CDN = "https://cdn.jsdelivr.net"


def content_security_policy(settings: Settings) -> str:
    """The lab's CSP: its own scripts and styles, and Realtime's endpoint when configured."""
    script = ["'self'"]
    connect = ["'self'"]
    if settings.realtime and settings.supabase_url:
        base = settings.supabase_url.rstrip("/")
        script.append(base)
        parts = urlsplit(base)
        socket = "wss" if parts.scheme == "https" else "ws"  # http: a local test project
        connect += [base, f"{socket}://{parts.netloc}"]
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src {' '.join(script)}",
            "style-src 'self'",
            "img-src 'self' data:",
            f"connect-src {' '.join(connect)}",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def api_docs_policy() -> str:
    return (
        f"default-src 'self'; script-src 'self' 'unsafe-inline' {API_DOC_CDN};"
        f" style-src 'self' 'unsafe-inline' {API_DOC_CDN}; img-src 'self' data: https:;"
        " connect-src 'self'; object-src 'none'; frame-ancestors 'none'"
    )


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc.lower()}"


class BrowserGuardMiddleware:
    """403 for a cross-origin state change; security headers on every response."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.allowed = {o.rstrip("/").lower() for o in settings.allowed_origins}
        self.headers = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"same-origin"),
        ]
        self.csp = content_security_policy(settings).encode()
        self.docs_csp = api_docs_policy().encode()

    def cross_origin(self, scope: Scope) -> str | None:
        """The foreign origin a state-changing request came from; None when it is ours."""
        headers = dict(scope.get("headers", ()))
        origin = headers.get(b"origin")
        if origin is not None:
            claimed: str | None = origin.decode("latin-1").strip()
            if claimed == "null":
                return "null"
        else:
            referer = headers.get(b"referer")
            if referer is None:
                return None  # not sent by a browser's cross-site request
            claimed = _origin_of(referer.decode("latin-1"))
            if claimed is None:
                return None  # an unparsable referer carries no origin to judge
        assert claimed is not None
        claimed = claimed.rstrip("/").lower()
        if claimed in self.allowed:
            return None
        own = request_origin(scope, self.settings)
        # The lab's own host on either scheme: a TLS-terminating proxy may hide which.
        if own is not None and urlsplit(claimed).netloc == urlsplit(own).netloc:
            return None
        return claimed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wrong_host = host_refusal(scope, self.settings)
        if wrong_host is not None:
            await self._refuse(send, 400, wrong_host)
            return
        if scope["method"] in STATE_CHANGING:
            foreign = self.cross_origin(scope)
            if foreign is not None:
                await self._refuse(send, 403, self._foreign_detail(foreign))
                return
        path = scope.get("path", "")
        csp = self.docs_csp if path.startswith(API_DOC_PAGES) else self.csp

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [*self.headers, (b"content-security-policy", csp)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    def _foreign_detail(foreign: str) -> str:
        return (
            f"a {foreign} page may not change this lab's state: requests that change"
            " something must come from the lab's own pages (or an origin in"
            " CRASHDRILL_ALLOWED_ORIGINS)"
        )

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *self.headers,
            (b"content-security-policy", self.csp),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

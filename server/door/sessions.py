"""Who is asking: a signed session cookie per browser (instructors: instructor_sessions.py).

Every browser gets a random session id in a cookie signed with the server's key
(itsdangerous), HttpOnly, SameSite=Lax (a cross-site form cannot crash someone's run;
server/door/browser_guard.py refuses cross-origin state changes too) and Secure when the lab is
served over https. A pair belongs to the session that created it.

Also here: the request-body cap, so that an oversized body is refused before any route
reads it.
"""

from __future__ import annotations

import json
import secrets
from http.cookies import SimpleCookie

from itsdangerous import BadSignature, URLSafeSerializer
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crashdrill.server.door.forwarded import served_over_https
from crashdrill.server.door.instructor_sessions import is_instructor
from crashdrill.server.settings import Settings

__all__ = ["BodyLimitMiddleware", "SessionMiddleware", "is_instructor", "session_of"]

COOKIE = "crashdrill_session"
COOKIE_MAX_AGE = 365 * 24 * 3600


class SessionMiddleware:
    """Puts the session id in `scope["state"]["session"]`; sets the cookie when new."""

    def __init__(self, app: ASGIApp, secret_key: str, settings: Settings) -> None:
        self.app = app
        self.signer = URLSafeSerializer(secret_key, salt="crashdrill-session")
        self.settings = settings

    def _read(self, scope: Scope) -> str | None:
        for name, value in scope.get("headers", ()):
            if name == b"cookie":
                cookie: SimpleCookie = SimpleCookie()
                try:
                    cookie.load(value.decode("latin-1"))
                except Exception:  # a malformed Cookie header is no session
                    return None
                morsel = cookie.get(COOKIE)
                if morsel is None:
                    continue
                try:
                    sid = self.signer.loads(morsel.value)
                except BadSignature:
                    return None
                return sid if isinstance(sid, str) else None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sid = self._read(scope)
        new = sid is None
        if sid is None:
            sid = secrets.token_urlsafe(18)
        state = scope.setdefault("state", {})
        state["session"] = sid
        secure = served_over_https(scope, self.settings)

        async def send_with_cookie(message: Message) -> None:
            if new and message["type"] == "http.response.start":
                value = self.signer.dumps(sid)
                cookie = (
                    f"{COOKIE}={value}; Path=/; Max-Age={COOKIE_MAX_AGE}; HttpOnly; SameSite=Lax"
                )
                if secure:
                    cookie += "; Secure"
                headers = list(message.get("headers", []))
                headers.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def session_of(request: Request) -> str:
    sid = request.scope.get("state", {}).get("session")
    return str(sid) if sid else ""


class BodyLimitMiddleware:
    """413 for a request body over `max_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _problem(send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await _too_large(send, self.max_bytes)
                    return
        # Read the whole (small) body first, counting, then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await _too_large(send, self.max_bytes)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Send, limit: int) -> None:
    await _problem(send, 413, f"the request body is over the limit of {limit} bytes")


async def _problem(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

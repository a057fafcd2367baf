"""Who is asking: a signed session cookie per browser, and the instructor token.

Every browser gets a random session id in a cookie signed with the server's key
(itsdangerous), HttpOnly and SameSite=Lax (a cross-site form cannot crash someone's run).
A pair belongs to the session that created it. An instructor presents
CRASHDRILL_INSTRUCTOR_TOKEN as `Authorization: Bearer TOKEN` (or `X-Instructor-Token`).

A browser logs in as instructor once (POST /api/instructor/login with the token): it
gets a second signed cookie, `crashdrill_instructor`, holding a fingerprint of the token,
so the page needs no header and a new token logs every instructor out.

Guessing is bounded: after `max_wrong_tokens` (default 10) wrong tokens, at login or in
a header, from one client address within GUESS_WINDOW_S, that address may offer no
token, right or wrong, until the oldest wrong one is out of the window (429 with
Retry-After). Behind a reverse proxy every client shares its address: the lab trusts no
forwarded-for header.

Also here: the request-body cap, so that an oversized body is refused before any route
reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from http.cookies import SimpleCookie

from itsdangerous import BadSignature, URLSafeSerializer
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crashdrill.server.errors import TooMany

COOKIE = "crashdrill_session"
COOKIE_MAX_AGE = 365 * 24 * 3600
INSTRUCTOR_COOKIE = "crashdrill_instructor"
INSTRUCTOR_COOKIE_MAX_AGE = 12 * 3600
GUESS_WINDOW_S = 60.0  # the window of the wrong instructor tokens counted per address
GUESS_ADDRESSES = 10_000  # addresses remembered at most (the oldest forgotten first)


class TokenGuesses:
    """Wrong instructor tokens per client address, in a sliding window. Thread-safe."""

    def __init__(
        self,
        limit: int = 10,
        window_s: float = GUESS_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wrong: dict[str, deque[float]] = {}

    def retry_after(self, who: str) -> float:
        """Seconds until `who` may offer a token again (0: now)."""
        now = self._clock()
        with self._lock:
            times = self._wrong.get(who)
            if times is None:
                return 0.0
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._wrong[who]
                return 0.0
            if len(times) < self.limit:
                return 0.0
            return times[0] + self.window_s - now

    def wrong(self, who: str) -> None:
        with self._lock:
            times = self._wrong.pop(who, None) or deque()
            times.append(self._clock())
            self._wrong[who] = times  # re-inserted: the dict's order is by last guess
            while len(self._wrong) > GUESS_ADDRESSES:
                del self._wrong[next(iter(self._wrong))]


def check_token(request: Request, offered: str, token: str) -> bool:
    """`offered` against the instructor token, counted against the client's guesses
    (TooMany when it has guessed wrong too often lately)."""
    guesses: TokenGuesses | None = getattr(request.app.state, "token_guesses", None)
    who = request.client.host if request.client else "?"
    if guesses is not None:
        wait = guesses.retry_after(who)
        if wait > 0:
            seconds = math.ceil(wait)
            raise TooMany(
                f"too many wrong instructor tokens from this address: try again in {seconds} s",
                headers={"Retry-After": str(seconds)},
            )
    if hmac.compare_digest(offered.encode(), token.encode()):
        return True
    if guesses is not None:
        guesses.wrong(who)
    return False


class SessionMiddleware:
    """Puts the session id in `scope["state"]["session"]`; sets the cookie when new."""

    def __init__(self, app: ASGIApp, secret_key: str, *, https_only: bool = False) -> None:
        self.app = app
        self.signer = URLSafeSerializer(secret_key, salt="crashdrill-session")
        self.instructor_signer = URLSafeSerializer(secret_key, salt="crashdrill-instructor")
        self.https_only = https_only

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
        state["instructor_signer"] = self.instructor_signer
        state["instructor_proof"] = _signed_cookie(scope, INSTRUCTOR_COOKIE, self.instructor_signer)

        async def send_with_cookie(message: Message) -> None:
            if new and message["type"] == "http.response.start":
                value = self.signer.dumps(sid)
                cookie = (
                    f"{COOKIE}={value}; Path=/; Max-Age={COOKIE_MAX_AGE}; HttpOnly; SameSite=Lax"
                )
                if self.https_only:
                    cookie += "; Secure"
                headers = list(message.get("headers", []))
                headers.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def session_of(request: Request) -> str:
    sid = request.scope.get("state", {}).get("session")
    return str(sid) if sid else ""


def is_instructor(request: Request, token: str | None) -> bool:
    """The token in a header, else the login cookie holding the token's fingerprint."""
    if not token:
        return False
    offered = request.headers.get("x-instructor-token", "")
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        offered = auth[7:].strip()
    if offered:
        return check_token(request, offered, token)
    proof = request.scope.get("state", {}).get("instructor_proof")
    return isinstance(proof, str) and hmac.compare_digest(proof, token_fingerprint(token))


def token_fingerprint(token: str) -> str:
    return hashlib.sha256(b"crashdrill-instructor:" + token.encode()).hexdigest()


def instructor_cookie(request: Request, token: str, *, https_only: bool = False) -> str:
    """The Set-Cookie value that logs this browser in as instructor."""
    signer: URLSafeSerializer = request.scope["state"]["instructor_signer"]
    value = signer.dumps(token_fingerprint(token))
    cookie = (
        f"{INSTRUCTOR_COOKIE}={value}; Path=/; Max-Age={INSTRUCTOR_COOKIE_MAX_AGE};"
        " HttpOnly; SameSite=Lax"
    )
    return cookie + ("; Secure" if https_only else "")


def _signed_cookie(scope: Scope, name: str, signer: URLSafeSerializer) -> str | None:
    for header, value in scope.get("headers", ()):
        if header != b"cookie":
            continue
        cookie: SimpleCookie = SimpleCookie()
        try:
            cookie.load(value.decode("latin-1"))
        except Exception:  # a malformed Cookie header carries nothing
            return None
        morsel = cookie.get(name)
        if morsel is None:
            continue
        try:
            loaded = signer.loads(morsel.value)
        except BadSignature:
            return None
        return loaded if isinstance(loaded, str) else None
    return None


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

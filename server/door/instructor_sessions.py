"""Instructor sessions: the token, a login that expires and a logout that revokes it.

An instructor presents CRASHDRILL_INSTRUCTOR_TOKEN (at least 16 characters: the server
refuses a shorter one at startup) as `Authorization: Bearer TOKEN` or `X-Instructor-Token`,
or logs a browser in once (POST /api/instructor/login with the token). A login creates a
random session id held by the server (`InstructorSessions`) and sets the cookie
`crashdrill_instructor`: that id, signed with the server's key and a timestamp. A cookie
counts while its signature is younger than `instructor_session_s` and the server still
holds its id; logout forgets the id, so a copy of the cookie replayed afterwards is
refused, and so does a restart of the server. Nothing derived from the token is in it.
The cookie is HttpOnly, SameSite=Lax, and Secure when the lab is served over https (the
`https` setting, or X-Forwarded-Proto from a trusted proxy: server/door/forwarded.py).

Guessing is slowed per client address without ever refusing the right token: the right
token always works; every wrong one is answered after WRONG_TOKEN_DELAY_S, and once an
address has offered `max_wrong_tokens` wrong ones within GUESS_WINDOW_S, its wrong ones
get 429 with Retry-After after OVER_LIMIT_DELAY_S instead (a student behind the classroom's
NAT cannot lock the instructor out). The delays hold however the token came — the login
form, either header, on any route: `check_token` notes the delay in the request's scope and
`WrongTokenDelay` (a middleware) holds the answer back by it, without holding a thread.
With a 16-character token the slowing is a brake on noise, not the protection: the
token's length is.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.datastructures import State
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crashdrill.server.door.forwarded import client_address, served_over_https
from crashdrill.server.errors import TooMany
from crashdrill.server.settings import Settings

INSTRUCTOR_COOKIE = "crashdrill_instructor"
GUESS_WINDOW_S = 60.0  # the window of the wrong instructor tokens counted per address
GUESS_ADDRESSES = 10_000  # addresses remembered at most (the oldest forgotten first)
MAX_SESSIONS = 1000  # instructor logins held at most (the oldest forgotten first)
WRONG_TOKEN_DELAY_S = 0.5  # every wrong token waits this long for its answer
OVER_LIMIT_DELAY_S = 2.0  # … and this long once its address is over the limit
_DELAY_KEY = "crashdrill.wrong_token_delay_s"  # in the request's scope: WrongTokenDelay's


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
        """Seconds until `who`'s wrong tokens are under the limit again (0: now)."""
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
    """True for the right token, always. A wrong one is counted against the client's
    address: False, or TooMany (429 with Retry-After) once the address is over the limit."""
    # Stripped, as the server's own token is (server/settings.py): a pasted token often
    # brings a space or a newline along.
    if hmac.compare_digest(offered.strip().encode(), token.encode()):
        return True
    _delay_answer(request, WRONG_TOKEN_DELAY_S)
    guesses: TokenGuesses | None = getattr(request.app.state, "token_guesses", None)
    if guesses is None:
        return False
    who = client_address(request.scope, settings_of(request))
    wait = guesses.retry_after(who)
    guesses.wrong(who)
    if wait <= 0:
        return False
    _delay_answer(request, OVER_LIMIT_DELAY_S)
    seconds = math.ceil(wait)
    raise TooMany(
        f"too many wrong instructor tokens from this address: wrong ones are refused for"
        f" {seconds} s (the right token still works)",
        headers={"Retry-After": str(seconds)},
    )


def _delay_answer(request: Request, seconds: float) -> None:
    scope = request.scope
    scope[_DELAY_KEY] = max(float(scope.get(_DELAY_KEY, 0.0)), seconds)


class WrongTokenDelay:
    """Middleware: a request that offered a wrong instructor token gets its answer only
    after the delay `check_token` noted (asyncio.sleep: no thread is held meanwhile)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_later(message: Message) -> None:
            if message["type"] == "http.response.start":
                delay = float(scope.get(_DELAY_KEY, 0.0))
                if delay > 0:
                    await asyncio.sleep(delay)
            await send(message)

        await self.app(scope, receive, send_later)


class InstructorSessions:
    """The logged-in instructor sessions this server holds: id -> expiry. Thread-safe."""

    def __init__(self, lifetime_s: float, clock: Callable[[], float] = time.time) -> None:
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._lock = threading.Lock()
        self._expires: OrderedDict[str, float] = OrderedDict()

    def new(self) -> str:
        sid = secrets.token_urlsafe(24)
        with self._lock:
            self._expires[sid] = self._clock() + self.lifetime_s
            while len(self._expires) > MAX_SESSIONS:
                self._expires.popitem(last=False)
        return sid

    def valid(self, sid: str) -> bool:
        with self._lock:
            expires = self._expires.get(sid)
            if expires is None:
                return False
            if expires <= self._clock():
                del self._expires[sid]
                return False
            return True

    def revoke(self, sid: str) -> None:
        with self._lock:
            self._expires.pop(sid, None)


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _signer(request: Request) -> URLSafeTimedSerializer:
    signer: URLSafeTimedSerializer = request.app.state.instructor_signer
    return signer


def session_in_cookie(request: Request) -> str | None:
    """The session id in a validly signed, unexpired instructor cookie; None otherwise."""
    raw = request.cookies.get(INSTRUCTOR_COOKIE)
    if not raw:
        return None
    try:
        sid = _signer(request).loads(raw, max_age=int(settings_of(request).instructor_session_s))
    except (BadSignature, SignatureExpired):
        return None
    return sid if isinstance(sid, str) else None


def is_instructor(request: Request, token: str | None) -> bool:
    """The token in a header (a wrong one counted: check_token), else a live login cookie."""
    if not token:
        return False
    offered = request.headers.get("x-instructor-token", "")
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        offered = auth[7:].strip()
    if offered:
        return check_token(request, offered, token)
    sid = session_in_cookie(request)
    sessions: InstructorSessions = request.app.state.instructor_sessions
    return sid is not None and sessions.valid(sid)


def cookie_attributes(request: Request, max_age: int) -> str:
    secure = "; Secure" if served_over_https(request.scope, settings_of(request)) else ""
    return f"Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"


def login_cookie(request: Request) -> str:
    """A new instructor session, as the Set-Cookie value that logs this browser in."""
    sessions: InstructorSessions = request.app.state.instructor_sessions
    value = _signer(request).dumps(sessions.new())
    max_age = int(settings_of(request).instructor_session_s)
    return f"{INSTRUCTOR_COOKIE}={value}; {cookie_attributes(request, max_age)}"


def logout_cookie(request: Request) -> str:
    """Revoke this browser's instructor session; the Set-Cookie value that clears it."""
    sid = session_in_cookie(request)
    if sid is not None:
        sessions: InstructorSessions = request.app.state.instructor_sessions
        sessions.revoke(sid)
    return f"{INSTRUCTOR_COOKIE}=; {cookie_attributes(request, 0)}"


def install(state: State, settings: Settings, secret_key: str) -> None:
    """Put the instructor sessions, the cookie signer and the guess counter on app.state."""
    state.instructor_sessions = InstructorSessions(settings.instructor_session_s)
    state.instructor_signer = URLSafeTimedSerializer(
        secret_key, salt="crashdrill-instructor-session"
    )
    if settings.max_wrong_tokens:
        state.token_guesses = TokenGuesses(settings.max_wrong_tokens)

"""`crashdrill doctor supabase`: does the lab's Supabase Realtime setup work?

    crashdrill doctor supabase                        SUPABASE_URL, SUPABASE_ANON_KEY,
                                                      SUPABASE_SERVICE_KEY from the environment
    crashdrill doctor supabase --url https://PROJECT.supabase.co --anon-key … --messages 10

It does what the lab does, through the same Supabase client code
(`realtime_publisher.connect`): a subscriber joins a test channel with the anon key (as the
page does), a publisher joins it with the service key (as the server does; the anon key
when there is none), the publisher sends `--messages` Broadcast messages with
acknowledgement, and the subscriber times each one's round trip (median and max). A
failure names its likely cause: a bad URL (DNS, connection refused, not a Realtime
endpoint), a bad key (HTTP 401/403, an invalid token), a channel the key may not join
(private channels need an RLS policy on realtime.messages), rate limiting (too_many_*,
*RateLimitReached), or a timeout. Exit 0 ok, 1 a check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from crashdrill.server.stream.realtime_publisher import channel_params, connect
from crashdrill.trainer.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

POLICY_SQL = """  create policy "crashdrill pages read lab broadcasts" on realtime.messages
    for select to anon using (
      realtime.messages.extension = 'broadcast'
      and realtime.topic() like 'crashdrill:%');"""


class CheckFailed(Exception):
    """One check failed; the message is the diagnosis."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the project URL (default: $SUPABASE_URL)")
    p.add_argument("--anon-key", help="the key the page uses (default: $SUPABASE_ANON_KEY)")
    p.add_argument(
        "--service-key",
        help="the key the server publishes with (default: $SUPABASE_SERVICE_KEY; without one"
        " the anon key publishes on a public channel, as the lab does)",
    )
    p.add_argument("--messages", type=int, default=5, help="round trips to time (default 5)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for each step (default 10)"
    )


def run(args: argparse.Namespace) -> int:
    url = (args.url or os.environ.get("SUPABASE_URL") or "").strip().rstrip("/")
    anon = (args.anon_key or os.environ.get("SUPABASE_ANON_KEY") or "").strip()
    service = (args.service_key or os.environ.get("SUPABASE_SERVICE_KEY") or "").strip()
    if not url or not anon:
        return _usage(
            "give the project URL and anon key (--url, --anon-key, or SUPABASE_URL"
            " and SUPABASE_ANON_KEY)"
        )
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        return _usage(f"--url {url!r}: the project URL, like https://PROJECT.supabase.co")
    if not 1 <= args.messages <= 100 or not 0 < args.timeout <= 300:
        return _usage("--messages is 1..100 and --timeout 0..300 seconds")
    try:
        import supabase  # noqa: F401
    except ImportError:
        return _usage("Supabase's Python client is missing: pip install 'crashdrill[supabase]'")
    try:
        return asyncio.run(_check(url, anon, service or None, args.messages, args.timeout))
    except CheckFailed as e:
        print(f"FAIL  {e}", flush=True)
        return EXIT_FAILED


def _usage(text: str) -> int:
    print(f"crashdrill doctor supabase: {text}", file=sys.stderr)
    return EXIT_USAGE


async def _check(url: str, anon: str, service: str | None, count: int, timeout: float) -> int:
    private = service is not None
    topic = f"crashdrill:doctor:{secrets.token_hex(4)}"
    kind = "private" if private else "public"
    print(f"Supabase Realtime at {url}/realtime/v1, {kind} test channel {topic}", flush=True)
    host = urlsplit(url).hostname or ""
    try:
        await asyncio.to_thread(socket.getaddrinfo, host, None)
    except socket.gaierror as e:
        raise CheckFailed(f"bad URL: the name {host!r} does not resolve ({e.strerror})") from None
    print(f"ok    {host} resolves", flush=True)

    clients: list[Any] = []
    try:
        received: dict[int, float] = {}
        got_all = asyncio.Event()

        def on_message(payload: dict[str, Any]) -> None:
            seq = (payload.get("payload") or {}).get("seq")
            if isinstance(seq, int) and seq not in received:
                received[seq] = time.perf_counter()
                if len(received) >= count:
                    got_all.set()

        await _join(clients, url, anon, "anon", topic, private, timeout, on_message)
        pub_key, pub_name = (service, "service") if service else (anon, "anon")
        pub = await _join(clients, url, pub_key, pub_name, topic, private, timeout, None)
        sent: dict[int, float] = {}
        for seq in range(count):
            sent[seq] = time.perf_counter()
            await _publish(pub, {"seq": seq, "t": time.time()}, timeout)
            await asyncio.sleep(0.2)  # 5 a second: far below every plan's rate limit
        print(f"ok    {count} messages published and acknowledged", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got_all.wait(), timeout)
        if not received:
            raise CheckFailed(
                f"timeout: the subscriber received none of {count} acknowledged messages in"
                f" {timeout:g} s (is Broadcast enabled for the project? a self-hosted Realtime"
                " behind a proxy that drops websocket frames?)"
            )
        rtts = sorted((received[s] - sent[s]) * 1000 for s in received if s in sent)
        print(
            f"ok    round trip publisher → Realtime → subscriber: median"
            f" {statistics.median(rtts):.0f} ms, max {rtts[-1]:.0f} ms ({len(rtts)} messages)",
            flush=True,
        )
        if len(received) < count:
            raise CheckFailed(f"{count - len(received)} of {count} messages never arrived")
    finally:
        for client in clients:
            with contextlib.suppress(Exception):  # closing is best effort
                await asyncio.wait_for(client.realtime.close(), 5)
    print("Supabase Realtime works for the lab.", flush=True)
    return EXIT_OK


async def _join(
    clients: list[Any],
    url: str,
    key: str,
    key_name: str,
    topic: str,
    private: bool,
    timeout: float,
    on_message: Any,
) -> Any:
    t0 = time.perf_counter()
    try:
        client = await asyncio.wait_for(connect(url, key, timeout), timeout + 1)
    except Exception as e:
        raise CheckFailed(_connect_diagnosis(e, url, key_name, timeout)) from None
    clients.append(client)
    role = "subscriber" if on_message else "publisher"
    print(
        f"ok    {role} connected with the {key_name} key"
        f" ({(time.perf_counter() - t0) * 1000:.0f} ms)",
        flush=True,
    )
    channel = client.channel(topic, channel_params(ack=on_message is None, private=private))
    if on_message is not None:
        channel.on_broadcast("doctor", on_message)
    states: list[tuple[str, str]] = []
    await asyncio.wait_for(
        channel.subscribe(lambda state, err: states.append((str(state.value), str(err or "")))),
        timeout + 2,
    )
    if not channel.is_joined:
        state, reason = states[-1] if states else ("TIMED_OUT", "")
        raise CheckFailed(_join_diagnosis(state, reason, key_name, private, timeout))
    print(f"ok    {role} joined the channel", flush=True)
    return channel


async def _publish(channel: Any, payload: dict[str, Any], timeout: float) -> None:
    done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def settle(result: str | None) -> None:
        if not done.done():
            done.set_result(result)

    body = {"type": "broadcast", "event": "doctor", "payload": payload}
    push = await channel.push("broadcast", body, int(timeout))
    push.receive("ok", lambda _r: settle(None))
    push.receive("error", lambda r: settle(str((r or {}).get("reason", r))))
    push.receive("timeout", lambda: settle("timeout"))
    problem = await asyncio.wait_for(done, timeout + 2)
    if problem == "timeout":
        raise CheckFailed(f"timeout: Realtime did not acknowledge a message in {timeout:g} s")
    if problem is not None:
        raise CheckFailed(_reason_diagnosis(problem, "publishing"))


def _connect_diagnosis(e: BaseException, url: str, key_name: str, timeout: float) -> str:
    from websockets.exceptions import InvalidStatus

    if isinstance(e, InvalidStatus):
        status = e.response.status_code
        if status in (401, 403):
            return (
                f"bad key: Realtime refused the {key_name} key (HTTP {status}); copy it again"
                " from the project's Settings → API keys"
            )
        if status == 404:
            return f"bad URL: {url}/realtime/v1/websocket is not a Realtime endpoint (HTTP 404)"
        if status == 429:
            return "rate limited: too many connections (HTTP 429); try again in a minute"
        return f"Realtime refused the connection with HTTP {status}"
    if isinstance(e, ConnectionRefusedError):
        return f"bad URL: connection refused by {urlsplit(url).netloc} (nothing listens there)"
    if isinstance(e, TimeoutError):
        return f"timeout: no websocket connection to {url} within {timeout:g} s"
    if isinstance(e, OSError):
        return f"bad URL: cannot reach {urlsplit(url).netloc}: {e.strerror or e}"
    return f"cannot connect to {url}: {type(e).__name__}: {e}"


def _join_diagnosis(state: str, reason: str, key_name: str, private: bool, timeout: float) -> str:
    if state == "TIMED_OUT" or not reason:
        return f"timeout: Realtime did not answer the channel join within {timeout:g} s"
    with contextlib.suppress(ValueError, AttributeError):  # the client wraps the reply
        reason = str(json.loads(reason).get("reason") or reason)
    return _reason_diagnosis(reason, f"joining with the {key_name} key", private)


def _reason_diagnosis(reason: str, doing: str, private: bool = False) -> str:
    low = reason.lower()
    if "too_many" in low or "ratelimit" in low or "rate limit" in low or "tenant_events" in low:
        return (
            f"rate limited while {doing}: Realtime said {reason!r}. The lab stays under the"
            " plan's limits with supabase_tick_s and supabase_max_messages_per_s (docs/server.md)"
        )
    if "unauthorized" in low or "permission" in low or "not allowed" in low:
        hint = (
            " Private channels need a policy that lets the page's anon role read, e.g. in the"
            f" SQL editor:\n{POLICY_SQL}"
            if private
            else ""
        )
        return f"channel not authorised while {doing}: Realtime said {reason!r}.{hint}"
    if "jwt" in low or "token" in low or "apikey" in low or "api key" in low:
        return f"bad key while {doing}: Realtime said {reason!r}"
    return f"Realtime refused {doing}: {reason!r}"

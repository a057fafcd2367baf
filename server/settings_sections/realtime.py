"""The realtime section of the settings: how pages follow runs, over the server's event
streams and Supabase Realtime when a project is given (server/stream/realtime.py)."""

from __future__ import annotations

from dataclasses import dataclass

from crashdrill.server.setting_schema import (
    NUMBER,
    TEXT,
    WHOLE,
    Allowed,
    at_least,
    between,
    other_variables,
    setting,
)


@dataclass(frozen=True)
class RealtimeSection:
    """How pages follow runs: the server's event streams, and Supabase Realtime when its
    project is given (docs/server.md "Supabase Realtime")."""

    TITLE = "Realtime"
    OTHER_VARIABLES = other_variables()

    stream_heartbeat_s: float = setting(
        15.0, default_text="15", what="`: ping` interval on idle streams"
    )
    stream_max_pending_records: int = setting(2000, what="per client and run, before a `gap`")
    stream_max_per_address: int = setting(
        64,
        parse=WHOLE,
        env="CRASHDRILL_STREAM_MAX_PER_ADDRESS",
        allowed=at_least(1),
        what="open event streams (one per tab) from one client address; 429 past it",
    )
    stream_max_total: int = setting(
        1000,
        parse=WHOLE,
        env="CRASHDRILL_STREAM_MAX_TOTAL",
        allowed=at_least(1),
        what="open event streams in all; 429 past it",
    )
    # On when the URL and the anon key are set.
    supabase_url: str | None = setting(
        None,
        default_text="none: Realtime off, SSE only",
        parse=TEXT,
        env="SUPABASE_URL",
        what="the project URL (`https://PROJECT.supabase.co`); with `supabase_anon_key` it"
        " turns [Supabase Realtime](#supabase-realtime) on",
    )
    supabase_anon_key: str | None = setting(
        None,
        default_text="none",
        parse=TEXT,
        env="SUPABASE_ANON_KEY",
        what="the project's anon (publishable) key: public, handed to the page, which"
        " subscribes with it",
    )
    supabase_service_key: str | None = setting(
        None,
        default_text="none: the anon key publishes on public channels",
        parse=TEXT,
        env="SUPABASE_SERVICE_KEY",
        secret=True,
        what="the service_role (secret) key: the server publishes with it on private"
        " channels; never sent to a browser, never logged",
    )
    supabase_tick_s: float = setting(
        1.0,
        parse=NUMBER,
        env="CRASHDRILL_SUPABASE_TICK_S",
        allowed=between(0.1, 60, "0.1 to 60 seconds"),
        what="at most one Broadcast message per pair this often (0.1–60)",
    )
    supabase_max_payload_bytes: int = setting(
        128 * 1024,
        parse=WHOLE,
        env="CRASHDRILL_SUPABASE_MAX_PAYLOAD_BYTES",
        allowed=between(
            4096,
            3_000_000,
            "4096 to 3000000 (Supabase allows 256 KB on the Free plan, 3,000 KB on paid plans)",
        ),
        what="cap on one message's JSON payload (4096–3000000; the Free plan allows 256 KB)",
    )
    supabase_max_messages_per_s: float = setting(
        20.0,
        default_text="20",
        parse=NUMBER,
        env="CRASHDRILL_SUPABASE_MAX_MESSAGES_PER_S",
        allowed=Allowed(
            "> 0 and at most 2500 (Supabase allows 100 a second on the Free plan)",
            lambda v: 0 < v <= 2500,
        ),
        what="the server's own sends, all pairs together (the Free plan allows 100 messages"
        " a second, deliveries included)",
    )

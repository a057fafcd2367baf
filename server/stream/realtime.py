"""Supabase Realtime Broadcast beside SSE: one batched message per pair per tick.

When SUPABASE_URL and SUPABASE_ANON_KEY are set (docs/server.md, "Supabase Realtime"),
`RealtimeFanout` replaces the plain `LocalFanout`: every message still goes to the SSE
streams of this process (they stay available as the page's fallback), and is also
gathered per pair. Once per `supabase_tick_s` each pair with something new gets ONE
Broadcast message (event "batch") on the topic `crashdrill:pair:<pair id>`:

    {"v": 1, "pair": ID, "seq": 7, "tick": 31, "t": 1718000000.5,
     "runs": [{"run": ID, "gap": false, "records": [...], "view": {...}, "checks": {...}}],
     "telemetry": {...}}

`records` are new records (each with its id, as on the SSE stream), `view` the run's
newest state (as in GET /api/pairs/{pair}), `checks` its newest resume checks
({"run", "checks"}), `telemetry` the newest machine sample. `seq` counts this pair's
messages since the server started: a page that sees a jump resyncs from the REST API.
A message never exceeds `supabase_max_payload_bytes`: the oldest records that do not fit
are left out and their run says `"gap": true` (the page refetches them with
/api/runs/{run}/records?after=…), exactly like a slow SSE client; a view or checks too
big to fit are left out with `"stale": true` (the page refetches the pair). A pair with
a live run gets an empty batch at least every KEEPALIVE_S, so a page can tell a silent
Realtime from a quiet run.

The gathering and the encoding run on the event loop's thread (they are cheap: string
joins); the network is the publisher thread's (server/stream/realtime_publisher.py), behind a
bounded outbox: a slow or failing Supabase never blocks ingest or the loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from crashdrill.server.background import BackgroundTask, every
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.stream.fanout import LocalFanout, Message, Subscriber

log = logging.getLogger(__name__)

TOPIC_PREFIX = "crashdrill:pair:"
EVENT = "batch"
KEEPALIVE_S = 10.0  # an empty batch this often to a pair with a live run
SILENCE_S = 35.0  # the page falls back to SSE after this long without a batch (live runs)
# The page's config, minus what only the server knows. Never the service key.
PAGE_KEYS = ("url", "key", "topic_prefix", "event", "private", "tick_s", "silence_s")


def topic_of(pair_id: str) -> str:
    return TOPIC_PREFIX + pair_id


def page_config(settings: Settings) -> dict[str, Any]:
    """What the page needs to subscribe: the project URL and the public anon key."""
    if not settings.realtime:
        return {"realtime": None}
    return {
        "realtime": {
            "url": (settings.supabase_url or "").rstrip("/"),
            "key": settings.supabase_anon_key,
            "topic_prefix": TOPIC_PREFIX,
            "event": EVENT,
            "private": bool(settings.supabase_service_key),
            "tick_s": settings.supabase_tick_s,
            "silence_s": max(SILENCE_S, 3 * settings.supabase_tick_s + KEEPALIVE_S),
        }
    }


@dataclass
class RunPending:
    records: list[str] = field(default_factory=list)
    gap: bool = False
    view: str | None = None  # JSON text of the run view
    checks: str | None = None  # JSON text of {"run", "checks"}


@dataclass
class PairPending:
    runs: dict[str, RunPending] = field(default_factory=dict)

    def run(self, run_id: str) -> RunPending:
        return self.runs.setdefault(run_id, RunPending())


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def encode_batch(
    pair_id: str,
    seq: int,
    tick: int,
    pending: PairPending,
    telemetry: str | None,
    cap: int,
    now: float | None = None,
) -> tuple[str, int]:
    """The batch as compact JSON text of at most `cap` bytes, and how many records were
    left out to fit (their runs say "gap": true)."""
    head = (
        f'{{"v":1,"pair":{json.dumps(pair_id)},"seq":{seq},"tick":{tick},'
        f'"t":{round(time.time() if now is None else now, 3)},"runs":['
    )
    runs = list(pending.runs.items())
    stale: set[str] = set()

    def fixed_size(with_telemetry: bool) -> int:
        n = _size(head) + 2 + max(0, len(runs) - 1)  # "]}" and the commas between runs
        if with_telemetry and telemetry is not None:
            n += len(',"telemetry":') + _size(telemetry)
        for run_id, rp in runs:
            n += _size(json.dumps(run_id)) + len('{"run":,"gap":false,"records":[]}')
            if run_id in stale:
                n += len(',"stale":true')
                continue
            if rp.view is not None:
                n += len(',"view":') + _size(rp.view)
            if rp.checks is not None:
                n += len(',"checks":') + _size(rp.checks)
        return n

    with_telemetry = telemetry is not None
    if fixed_size(with_telemetry) > cap:
        with_telemetry = False
    for run_id, rp in sorted(runs, key=lambda r: -_size((r[1].view or "") + (r[1].checks or ""))):
        if fixed_size(with_telemetry) <= cap:
            break
        if rp.view is not None or rp.checks is not None:
            stale.add(run_id)
    budget = cap - fixed_size(with_telemetry)

    # Share the budget between the runs' records; a run that needs less than its share
    # leaves the rest to the others. Within a run the newest records are kept.
    sizes = {run_id: [_size(r) + 1 for r in rp.records] for run_id, rp in runs}  # +1: comma
    kept: dict[str, int] = {}
    order = sorted(runs, key=lambda r: sum(sizes[r[0]]))
    left = max(0, budget)
    for i, (run_id, _rp) in enumerate(order):
        share = left // (len(order) - i)
        used = 0
        n = 0
        for s in reversed(sizes[run_id]):
            if used + s > share:
                break
            used += s
            n += 1
        kept[run_id] = n
        left -= used

    dropped = 0
    parts = []
    for run_id, rp in runs:
        n = kept.get(run_id, 0)
        records = rp.records[len(rp.records) - n :] if n else []
        dropped += len(rp.records) - n
        gap = rp.gap or n < len(rp.records)
        text = (
            f'{{"run":{json.dumps(run_id)},"gap":{"true" if gap else "false"},'
            f'"records":[{",".join(records)}]'
        )
        if run_id in stale:
            text += ',"stale":true'
        else:
            if rp.view is not None:
                text += f',"view":{rp.view}'
            if rp.checks is not None:
                text += f',"checks":{rp.checks}'
        parts.append(text + "}")
    body = head + ",".join(parts) + "]"
    if with_telemetry:
        body += f',"telemetry":{telemetry}'
    return body + "}", dropped


class RealtimeFanout:
    """LocalFanout (SSE) plus one Broadcast message per pair per tick.

    `pair_of(run_id)` maps a run to its pair; `live_pairs()` lists the pairs with a run
    queued or active (they get the machine telemetry and keepalives). Both run on the
    loop's thread, once per message and once per tick.
    """

    def __init__(
        self,
        settings: Settings,
        pair_of: Callable[[str], str | None],
        live_pairs: Callable[[], Iterable[str]],
        publisher: Any | None = None,
    ) -> None:
        self.settings = settings
        self.local = LocalFanout(settings.stream_max_pending_records)
        self.pair_of = pair_of
        self.live_pairs = live_pairs
        if publisher is None:
            from crashdrill.server.stream.realtime_publisher import Publisher

            publisher = Publisher.from_settings(settings)
        self.publisher = publisher
        self._pairs: dict[str, str] = {}  # run -> pair (never changes)
        self._pending: dict[str, PairPending] = {}
        self._telemetry: str | None = None
        self._seq: dict[str, int] = {}
        self._last_sent: dict[str, float] = {}
        self._task = BackgroundTask("crashdrill-realtime-tick", log)
        self.ticks = 0
        self.dropped = 0  # records left out of batches (a gap for the page to refetch)

    # ---- the Fanout interface -------------------------------------------------------

    def publish(self, channel: str, message: Message) -> None:
        self.local.publish(channel, message)
        if channel.startswith("run:"):
            self._gather(channel[4:], message)
        elif message.event == "telemetry":
            self._telemetry = message.data

    def subscribe(self, channels: Iterable[str]) -> Subscriber:
        return self.local.subscribe(channels)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.local.unsubscribe(sub)

    def has_subscribers(self, channel: str) -> bool:
        return self.local.has_subscribers(channel)  # the SSE ones; Broadcast's are not seen

    def start(self) -> None:
        self.publisher.start()
        failed = "Supabase Realtime: building the batches failed; retrying"
        # A DatabaseUnavailable is the lab's ingest's to say, once per outage.
        self._task.start(every(self.settings.supabase_tick_s, self.flush, log, failed))

    def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(Exception):
            self.flush()  # the last records, if the outbox has room
        self.publisher.close()
        self.local.close()

    # ---- gathering and the tick -----------------------------------------------------

    def _gather(self, run_id: str, message: Message) -> None:
        pair = self._pairs.get(run_id)
        if pair is None:
            pair = self.pair_of(run_id)
            if pair is None:
                return
            self._pairs[run_id] = pair
        rp = self._pending.setdefault(pair, PairPending()).run(run_id)
        if message.event == "records":
            rp.records.extend(message.items)
            overflow = len(rp.records) - self.settings.stream_max_pending_records
            if overflow > 0:  # Supabase unreachable for a while: keep the newest
                del rp.records[:overflow]
                rp.gap = True
                self.dropped += overflow
        elif message.event == "run":
            rp.view = message.data
        elif message.event == "resume_checks":
            rp.checks = message.data

    def flush(self, now: float | None = None) -> int:
        """One tick: at most one message per pair into the publisher's outbox. Pairs
        that do not fit stay pending (and keep gathering) for the next tick."""
        now = time.monotonic() if now is None else now
        self.ticks += 1
        telemetry, self._telemetry = self._telemetry, None
        live = set(self.live_pairs())
        pairs = list(self._pending)
        pairs += [
            p
            for p in live
            if p not in self._pending
            and (telemetry is not None or now - self._last_sent.get(p, 0.0) >= KEEPALIVE_S)
        ]
        sent = 0
        for pair in pairs:
            if self.publisher.full():
                break
            pending = self._pending.pop(pair, None) or PairPending()
            seq = self._seq.get(pair, 0) + 1
            text, dropped = encode_batch(
                pair,
                seq,
                self.ticks,
                pending,
                telemetry if pair in live else None,
                self.settings.supabase_max_payload_bytes,
            )
            if not self.publisher.offer(topic_of(pair), text):
                self._pending[pair] = pending
                break
            self._seq[pair] = seq
            self._last_sent[pair] = now
            self.dropped += dropped
            sent += 1
        for pair in [p for p in self._last_sent if p not in live and p not in self._pending]:
            del self._last_sent[pair]
        return sent


def realtime_fanout(
    settings: Settings,
    pair_of: Callable[[str], str | None],
    live_pairs: Callable[[], Sequence[str]],
) -> RealtimeFanout | None:
    """The Realtime fan-out when Supabase is configured, else None (plain SSE)."""
    if not settings.realtime:
        return None
    try:
        import supabase  # noqa: F401  (the optional client: crashdrill[supabase])
    except ImportError:
        raise SettingsError(
            "SUPABASE_URL is set but Supabase's Python client is not installed:"
            " pip install 'crashdrill[supabase]'"
        ) from None
    fanout = RealtimeFanout(settings, pair_of, live_pairs)
    private = "private" if settings.supabase_service_key else "public"
    log.info(
        "Supabase Realtime: publishing to %s on %s channels %s<pair> (one message per pair"
        " per %.1f s, at most %g a second, at most %d bytes each); SSE stays on",
        settings.supabase_url,
        private,
        TOPIC_PREFIX,
        settings.supabase_tick_s,
        settings.supabase_max_messages_per_s,
        settings.supabase_max_payload_bytes,
    )
    if not settings.supabase_service_key:
        log.warning(
            "Supabase Realtime: no SUPABASE_SERVICE_KEY, so the server publishes with the"
            " anon key on public channels, where anyone who has the page's key and a pair"
            " id could publish too; set SUPABASE_SERVICE_KEY for private channels"
        )
    return fanout

"""One simulated student of benchmarks/class_load.py: a browser tab on its own loopback
address with its own cookie jar, doing what the lab page does.

    student = Student(index=0, address="127.0.0.2", arrive_s=4.2, rng=random.Random(7))
    await student.attend(base_url, preset="quick", poll_s=2.0, timeout_s=900)
    student.runs["A"].crash_to_recomputed_s   # what it measured

It loads the page's data (GET /api/presets, which sets its session cookie), starts a pair
(POST /api/pairs with the page's Origin), opens the pair's event stream and loads each
run's history as the page does, and reads GET /api/pairs/{pair} every `poll_s` while its
runs live (the page's responsiveness, timed). Once run A's first `ckpt` record has come on
the stream it draws a step past that checkpoint from its own RNG and presses Crash test
on A when the stream shows that step; a run that ends first is a missed crash. It keeps
the stream open until both runs have ended and every line of their records files has
come through it (or `DRAIN_S` passed). Every time is `time.time()` on arrival, the clock
the trainers write `t` with (one machine).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from crashdrill.trainer.run_files import MIRROR_LOG, RECORDS_FILE, read_complete_lines

TERMINAL = frozenset({"finished", "failed", "stopped"})
DRAIN_S = 20.0  # after both runs ended: how long the stream may take to bring the rest


@dataclass
class RunSeen:
    """One run as its student saw it on the stream and through the API."""

    id: str
    label: str
    state: str = "queued"
    steps: int | None = None
    records: dict[int, dict[str, Any]] = field(default_factory=dict)  # by record id
    loaded: set[int] = field(default_factory=set)  # ids the page's first load brought
    repeated_ids: int = 0  # records the stream sent twice
    gaps: int = 0  # stream messages that said records were dropped
    left_queue_at: float | None = None  # the first view not `queued`
    queued_seen: bool = False
    first_step_at: float | None = None
    first_ckpt_step: int | None = None
    crash_target: int | None = None  # the step the student waits for before Crash test
    crash_sent_at: float | None = None
    crash_status: int | None = None
    crash_missed: str | None = None  # why no crash test hit the run
    recomputed_at: float | None = None  # first step record of segment 1 on the stream
    verdict_at: float | None = None
    verdict: dict[str, Any] | None = None  # the complete resume check of segment 1
    cost_no_step: bool = False  # the kill landed on a checkpoint: nothing to recompute
    delays: list[float] = field(default_factory=list)  # record written → received, s

    def received_keys(self) -> Counter[tuple[Any, ...]]:
        return Counter(record_key(r) for r in self.records.values())


def record_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a record line across the file, the API and the stream (the API
    rewrites paths run-relative, so not the whole text)."""
    return (rec.get("kind"), rec.get("segment", 0), rec.get("step"), rec.get("t"))


def file_keys(run_dir: Path) -> Counter[tuple[Any, ...]]:
    """Every complete line of the run's records.jsonl and mirror.jsonl, as record keys."""
    keys: Counter[tuple[Any, ...]] = Counter()
    for name in (RECORDS_FILE, MIRROR_LOG):
        for _offset, line in read_complete_lines(run_dir / name).lines():
            if line.strip():
                keys[record_key(json.loads(line))] += 1  # a line that is no record: fails
    return keys


def settled(run_dir: Path, seen: RunSeen) -> bool:
    """Whether an ended run has written everything it will: its last checkpoint reached
    the mirror (the server tails a run until then), and the stream brought every line."""
    keys = file_keys(run_dir)
    ckpts = [k[2] for k in keys if k[0] == "ckpt"]
    mirrored = {k[2] for k in keys if k[0] == "mirror"}
    if ckpts and max(ckpts) not in mirrored:
        return False
    return not (keys - seen.received_keys())


@dataclass
class Student:
    index: int
    address: str  # the loopback address it connects from
    arrive_s: float  # after the class starts
    rng: random.Random
    pair: str | None = None
    posted_at: float | None = None
    done_at: float | None = None
    error: str | None = None  # why it could not take part (a refused pair, a timeout)
    statuses: Counter[int] = field(default_factory=Counter)  # every answer it got
    pair_get_s: list[float] = field(default_factory=list)  # GET /api/pairs/{pair}
    runs: dict[str, RunSeen] = field(default_factory=dict)  # by label
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)  # crash tests in flight

    async def attend(
        self, base_url: str, data_dir: Path, preset: str, poll_s: float, timeout_s: float
    ) -> None:
        transport = httpx.AsyncHTTPTransport(local_address=self.address)
        headers = {"Origin": base_url}  # as the lab's own page sends its POSTs
        async with httpx.AsyncClient(
            base_url=base_url, transport=transport, headers=headers, timeout=60
        ) as client:
            try:
                await asyncio.wait_for(self._attend(client, data_dir, preset, poll_s), timeout_s)
            except TimeoutError:
                self.error = f"not done after {timeout_s:.0f}s"
            except httpx.HTTPError as e:
                self.error = f"{type(e).__name__}: {e}"
        self.done_at = time.time()

    async def _call(self, client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
        r = await client.request(method, url, **kw)
        self.statuses[r.status_code] += 1
        return r

    async def _attend(
        self, client: httpx.AsyncClient, data_dir: Path, preset: str, poll_s: float
    ) -> None:
        await self._call(client, "GET", "/api/presets")  # the lab page; sets the cookie
        self.posted_at = time.time()
        r = await self._call(client, "POST", "/api/pairs", json={"preset": preset})
        if r.status_code != 201:
            self.error = f"POST /api/pairs: {r.status_code} {r.text[:200]}"
            return
        created = r.json()
        self.pair = created["pair"]
        self.runs = {x["label"]: RunSeen(x["id"], x["label"]) for x in created["runs"]}
        stream = asyncio.create_task(self._follow(client))
        poller = asyncio.create_task(self._poll(client, poll_s))
        try:
            await self._load_page(client)
            while not all(r.state in TERMINAL for r in self.runs.values()):
                if stream.done():
                    stream.result()  # raises what ended it
                    raise httpx.ReadError("the event stream ended before the runs did")
                await asyncio.sleep(0.1)
            poller.cancel()
            deadline = time.monotonic() + DRAIN_S
            while time.monotonic() < deadline and not stream.done():
                if all(settled(data_dir / "runs" / r.id, r) for r in self.runs.values()):
                    break
                await asyncio.sleep(0.2)
        finally:
            for task in (stream, poller):
                task.cancel()
            await asyncio.gather(stream, poller, *self._tasks, return_exceptions=True)
        a = self.runs["A"]
        if a.crash_sent_at is None and a.crash_missed is None:
            a.crash_missed = (
                f"{a.state} before step {a.crash_target}"
                if a.crash_target is not None
                else f"{a.state} before its first checkpoint came"
            )

    async def _load_page(self, client: httpx.AsyncClient) -> None:
        """The pair page's first loads: the pair, the record contract, each run's history
        and resume checks, the machine sample."""
        await self._get_pair(client)
        await self._call(client, "GET", "/api/record-kinds")
        for run in self.runs.values():
            r = await self._call(client, "GET", f"/api/runs/{run.id}/records", params={"after": 0})
            if r.status_code == 200:  # what the page shows before the stream brings more
                for rec in r.json()["records"]:
                    if rec["id"] not in run.records:
                        run.records[rec["id"]] = rec
                        run.loaded.add(rec["id"])
            await self._call(client, "GET", f"/api/runs/{run.id}/resume-checks")
        await self._call(client, "GET", "/api/machine", params={"pair": self.pair})

    async def _get_pair(self, client: httpx.AsyncClient) -> None:
        t0 = time.perf_counter()
        r = await self._call(client, "GET", f"/api/pairs/{self.pair}")
        if r.status_code == 200:
            self.pair_get_s.append(time.perf_counter() - t0)

    async def _poll(self, client: httpx.AsyncClient, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            await self._get_pair(client)

    async def _follow(self, client: httpx.AsyncClient) -> None:
        """The pair's event stream, frame by frame, until cancelled."""
        params = {"pair": self.pair}
        headers = {"Accept": "text/event-stream"}
        async with client.stream("GET", "/api/stream", params=params, headers=headers) as r:
            self.statuses[r.status_code] += 1
            if r.status_code != 200:
                raise httpx.ReadError(f"GET /api/stream: {r.status_code}")
            buf = b""
            async for chunk in r.aiter_raw():
                now = time.time()
                buf += chunk
                end = buf.rfind(b"\n\n")
                if end < 0:
                    continue
                frames, buf = buf[: end + 2], buf[end + 2 :]
                for raw in frames.split(b"\n\n"):
                    event, data = parse_frame(raw)
                    if event is not None and data is not None:
                        self._on_event(client, event, json.loads(data), now)

    def _on_event(self, client: httpx.AsyncClient, event: str, data: Any, now: float) -> None:
        by_id = {r.id: r for r in self.runs.values()}
        if event == "hello":
            for view in data["pair"]["runs"]:
                self._on_view(by_id[view["id"]], view, now)
        elif event == "run":
            self._on_view(by_id[data["id"]], data, now)
        elif event == "records":
            run = by_id[data["run"]]
            skipped = data.get("after") is not None and data["after"] > max(run.records, default=0)
            if data["gap"] or skipped:  # the page refetches what was dropped or skipped, as here
                run.gaps += 1
                after = max(run.records, default=0)
                self._tasks.add(
                    asyncio.get_running_loop().create_task(self._refetch(client, run, after))
                )
            for rec in data["records"]:
                self._on_record(client, run, rec, now)
        elif event == "resume_checks":
            run = by_id[data["run"]]
            for check in data["checks"]:
                if check["segment"] != 1 or not check["complete"] or run.verdict is not None:
                    continue
                if check["bit_identical"] is not None:
                    run.verdict, run.verdict_at = check, now
                elif check["expected_points"] == 0:
                    run.cost_no_step = True

    def _on_view(self, run: RunSeen, view: dict[str, Any], now: float) -> None:
        run.state = view["state"]
        run.steps = view["steps"] or run.steps
        if run.state == "queued":
            run.queued_seen = True
        elif run.left_queue_at is None:
            run.left_queue_at = now if run.queued_seen else self.posted_at

    def _on_record(
        self, client: httpx.AsyncClient, run: RunSeen, rec: dict[str, Any], now: float
    ) -> None:
        if rec["id"] in run.loaded:  # the first load had it; the stream too: not repeated
            run.loaded.discard(rec["id"])
            return
        if rec["id"] in run.records:
            run.repeated_ids += 1
            return
        run.records[rec["id"]] = rec
        if isinstance(rec.get("t"), int | float):
            run.delays.append(now - rec["t"])
        kind, step = rec["kind"], rec.get("step")
        if kind == "step" and run.first_step_at is None:
            run.first_step_at = now
        if kind == "step" and rec.get("segment") == 1 and run.recomputed_at is None:
            run.recomputed_at = now
        if run.label != "A":
            return
        if kind == "ckpt" and run.first_ckpt_step is None and run.steps:
            run.first_ckpt_step = step
            if step < run.steps - 1:
                run.crash_target = self.rng.randint(step + 1, run.steps - 1)
            else:
                run.crash_missed = f"its first checkpoint (step {step}) was its last step"
        target = run.crash_target
        due = target is not None and kind == "step" and step >= target
        if due and rec.get("segment") == 0 and run.crash_sent_at is None:
            run.crash_sent_at = time.time()
            self._tasks.add(asyncio.get_running_loop().create_task(self._crash(client, run)))
        if kind == "stage" and rec.get("stage") == "finished" and run.crash_sent_at is None:
            run.crash_missed = run.crash_missed or f"finished before step {target}"

    async def _crash(self, client: httpx.AsyncClient, run: RunSeen) -> None:
        try:
            r = await self._call(client, "POST", f"/api/runs/{run.id}/crash")
        except httpx.HTTPError as e:
            self.error = f"POST …/crash: {type(e).__name__}: {e}"
            return
        run.crash_status = r.status_code
        if r.status_code != 202:
            run.crash_missed = f"Crash test answered {r.status_code}: {r.text[:200]}"

    async def _refetch(self, client: httpx.AsyncClient, run: RunSeen, after: int) -> None:
        """The records a gap dropped, from the records API (not timed: not the stream's)."""
        try:
            r = await self._call(
                client, "GET", f"/api/runs/{run.id}/records", params={"after": after}
            )
        except httpx.HTTPError as e:
            self.error = f"GET …/records after a gap: {type(e).__name__}: {e}"
            return
        for rec in r.json()["records"] if r.status_code == 200 else []:
            run.records.setdefault(rec["id"], rec)


def parse_frame(raw: bytes) -> tuple[str | None, str | None]:
    """(event, data) of one SSE frame; (None, None) for a comment (`: ping`)."""
    event = None
    data: list[str] = []
    for line in raw.decode().split("\n"):
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    return event, "\n".join(data) if data else None

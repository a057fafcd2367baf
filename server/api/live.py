"""Live data: the machine's latest telemetry and one SSE stream per browser tab.

The stream of a pair carries, as SSE events:
- `hello` once: {"pair": <the pair's state>, "machine": <latest sample or null>,
  "nodes": [the newest sample of each Ray node its runs are on], "cluster": <reachability>};
- `records`: {"run", "gap", "records": [...]} — new records of one run, each with its
  `id`; `gap: true` when the client was too slow and older ones were dropped (refetch
  with /api/runs/{run}/records?after=…). The SSE `id` is the newest record id, so a
  reconnecting EventSource (Last-Event-ID) gets what it missed;
- `run`: one run's state (as in /api/pairs/{pair}), latest value only;
- `resume_checks`: {"run", "checks": [...]}, latest value only;
- `telemetry`: the machine sample, latest value only; on a Ray cluster also a node's
  sample (with `node`, one per node its runs are on) and `{"cluster": …}` when the
  cluster's reachability changes;
- a `: ping` comment when nothing happened for a while.

Open streams are bounded per client address and in all (server/stream/slots.py): 429
with Retry-After past either limit.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from crashdrill.server.api.pairs import lab_of
from crashdrill.server.api.schemas import Machine, problems
from crashdrill.server.door.forwarded import client_address
from crashdrill.server.door.sessions import session_of
from crashdrill.server.errors import NotFound
from crashdrill.server.lab import Lab
from crashdrill.server.storage.store import state_rank
from crashdrill.server.stream.fanout import frame
from crashdrill.server.stream.slots import StreamSlots
from crashdrill.server.stream.telemetry_feed import MACHINE_CHANNEL
from crashdrill.server.views import record_json

router = APIRouter(prefix="/api", tags=["live"])


@router.get("/machine", response_model=Machine, summary="The newest machine telemetry sample")
def machine(
    request: Request,
    pair: str | None = Query(default=None, description="also the samples of its runs' nodes"),
) -> dict[str, Any]:
    # A plain def: the pair's view reads the database, on a worker thread.
    lab = lab_of(request)
    nodes: list[dict[str, Any]] = []
    if pair is not None and lab.telemetry.nodes:
        runs = [{"host": _host(lab, r)} for r in lab.store.runs_of_pair(pair)]
        nodes = lab.telemetry.for_pair(runs)
    return {"sample": lab.telemetry.latest, "nodes": nodes, "cluster": lab.telemetry.cluster()}


def _host(lab: Lab, run: Any) -> dict[str, str] | None:
    host = lab.executor.host(Path(run["run_dir"]))
    return host.to_dict() if host is not None else None


@router.get(
    "/stream",
    summary="Server-sent events: both runs' records and state, and machine telemetry",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "an endless event stream"},
        **problems(404, 422, 429),
    },
)
async def stream(
    request: Request, pair: str = Query(description="the pair to follow")
) -> StreamingResponse:
    lab = lab_of(request)
    session = session_of(request)
    # The database's reads on a worker thread (a remote one must not stall the loop).
    # Subscribed before the view is read, so nothing published meanwhile is missed.
    run_ids = [r["id"] for r in await run_in_threadpool(lab.store.runs_of_pair, pair)]
    if not run_ids:
        raise NotFound(f"no pair {pair!r}")
    after = _last_event_id(request)
    slots: StreamSlots = request.app.state.stream_slots
    slot = slots.take(client_address(request.scope, lab.settings))  # 429 past a limit
    sub = lab.fanout.subscribe([*(f"run:{r}" for r in run_ids), MACHINE_CHANNEL])
    try:
        view = await run_in_threadpool(lab.pair, pair, session)
    except BaseException:
        lab.fanout.unsubscribe(sub)
        slot.release()
        raise
    for run in view["runs"]:  # what was published before this read is older: not sent
        sub.seen(f"run:{run['id']}", state_rank(run["state"]))
    hello = json.dumps(
        {
            "pair": view,
            "machine": lab.telemetry.latest,
            "nodes": lab.telemetry.for_pair(view["runs"]),
            "cluster": lab.telemetry.cluster(),
        },
        separators=(",", ":"),
    )

    async def body() -> AsyncIterator[bytes]:
        try:
            yield frame("hello", hello)
            if after is not None:
                yield await run_in_threadpool(_backfill, lab, run_ids, after)
            heartbeat = lab.settings.stream_heartbeat_s
            while not sub.closed:
                frames = await sub.next(heartbeat)
                yield b"".join(frames) if frames else b": ping\n\n"
        finally:
            lab.fanout.unsubscribe(sub)
            slot.release()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _last_event_id(request: Request) -> int | None:
    raw = request.headers.get("last-event-id", "")
    return int(raw) if raw.isdigit() and len(raw) < 19 else None


def _backfill(lab: Lab, run_ids: list[str], after: int) -> bytes:
    """What a reconnecting client missed, per run; only a gap marker when that is more
    than a slow client may hold (the page then refetches with /records?after=…)."""
    cap = lab.settings.stream_max_pending_records
    rows = lab.store.records_of_runs(run_ids, after, cap + 1)
    gap = len(rows) > cap
    out = []
    for run_id in run_ids:
        mine = [] if gap else [r for r in rows if r["run_id"] == run_id]
        if not mine and not gap:
            continue
        items = ",".join(record_json(r["id"], run_id, r["data"]) for r in mine)
        flag = "true" if gap else "false"
        data = f'{{"run":{json.dumps(run_id)},"gap":{flag},"records":[{items}]}}'
        out.append(frame("records", data, mine[-1]["id"] if mine else None))
    return b"".join(out)

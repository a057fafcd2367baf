"""A remote Postgres (10–30 ms away, like a Supabase project): how much slower is the lab?

    python benchmarks/remote_db.py                          # one-way delay 0, 5, 15 ms
    python benchmarks/remote_db.py --delays-ms 0 15 --seconds 20
    python benchmarks/remote_db.py --smoke                  # CI size: one 5 ms delay, 2 s

One throwaway PostgreSQL (`tests/support/postgres.py`) for the whole benchmark; for each
one-way delay a fresh database behind a `LatencyProxy` (`tests/support/latency_proxy.py`,
so a round trip costs 2 × delay more), and a fresh server subprocess
(`python -m crashdrill.server`) whose CRASHDRILL_DATABASE_URL points at the proxy. Its
runs are stand-in trainers writing one step record every `--step-s` (default 0.01: 100
records/s per run). Once both runs of one `quick` pair are running, for `--seconds` this
process measures at once:
- the event loop: GET /api/presets (no database) every `--sample-s`, each request on its
  own schedule so a stalled server cannot hide behind a waiting client;
- GET /api/pairs/{pair} (three queries) every `--pair-every-s` (0.2 s: a load of its own;
  a page asks once, then follows the stream);
- the SSE stream /api/stream?pair=…: per record, receive time − the `t` the trainer wrote,
  and records/s received against records/s written into records.jsonl.
It prints p50/p99/max of each and the server's CPU (100% = one core), one row per delay.
A request that times out (10 s) counts as 10 s, so its row's percentiles are lower bounds.
A delay at which no request was answered or no record of the window reached the stream
measured nothing: the script says why instead of printing a row, and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil

from crashdrill.trainer.run_files import RECORDS_FILE, RUN_JSON

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support is not installed

from sse_frames import sse_frames  # noqa: E402

from tests.support.lab import free_port, spawn_server  # noqa: E402
from tests.support.latency_proxy import LatencyProxy  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402

STAND_IN = ROOT / "tests" / "support" / "stand_in_trainer.py"
RECORD = re.compile(rb'"id":(\d+),"run":"([^"]+)","v":1,"kind":"([a-z]+)","t":([0-9.e+-]+)')
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 10
SETUP_MARGIN_S = 120  # trainer steps to spare for start-up, settling and the tail


@dataclass
class Stream:
    seen: list[tuple[float, float]] = field(default_factory=list)  # (t written, received)
    hello: bool = False
    gaps: int = 0
    error: str | None = None


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)
    timeouts: int = 0  # also in `seconds`, at REQUEST_TIMEOUT_S: percentiles become lower bounds
    errors: int = 0  # not in `seconds`


@dataclass
class Observed:
    presets: Latencies
    pair: Latencies
    stream: Stream
    start: float  # time.time() at the window's start
    server_cpu_pct: float


# -- the proxy, in its own process: its thread and this process's measuring loop would
# -- otherwise take turns on one GIL and add each other's stalls to the numbers.


def _proxy_main(target_port: int, delay_s: float, ports: Any, stop: Any) -> None:
    with LatencyProxy(target_port, delay_s=delay_s) as proxy:
        ports.put(proxy.port)
        stop.wait()


@contextmanager
def proxied(target_port: int, delay_s: float) -> Iterator[int]:
    """The port of a LatencyProxy to 127.0.0.1:target_port, until the block ends."""
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_proxy_main, args=(target_port, delay_s, ports, stop), daemon=True)
    proc.start()
    try:
        yield int(ports.get(timeout=START_TIMEOUT_S))
    finally:
        stop.set()
        proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def via(url: str, port: int) -> str:
    """`url` with its host:port replaced by 127.0.0.1:port (user and password kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}"))


# -- the lab


def start_server(
    data_dir: Path, port: int, database_url: str, step_s: float, steps: int
) -> subprocess.Popen[bytes]:
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("CRASHDRILL_", "SUPABASE_"))
    }
    env = {
        **inherited,
        "CRASHDRILL_DATABASE_URL": database_url,
        "CRASHDRILL_TELEMETRY": "0",
        "CRASHDRILL_MAX_CONCURRENT": "2",
        "CRASHDRILL_TRAINER_COMMAND": f"{sys.executable} {STAND_IN}",
        "CRASHDRILL_STANDIN_STEPS": str(steps),
        "CRASHDRILL_STANDIN_STEP_S": str(step_s),
        "CRASHDRILL_STANDIN_CKPT_EVERY": "1000000",
        # a trainer inherits only allowlisted variables (workers/trainer_env.py): without
        # this the stand-in ran its default 60 steps and was done before the window
        "CRASHDRILL_TRAINER_ENV_PASS": "CRASHDRILL_STANDIN_*",
    }
    args = ["--data-dir", str(data_dir), "--log-level", "warning"]
    args += ["--mirror", "off", "--stop-runs-on-exit"]
    try:
        log = data_dir / "server.log"
        return spawn_server(port, env, log, *args, start_timeout=START_TIMEOUT_S)
    except AssertionError as e:
        sys.exit(f"server did not start: {e}")


def stop_server(proc: subprocess.Popen[bytes], data_dir: Path) -> None:
    """SIGINT (it stops its runs on exit), SIGKILL past STOP_TIMEOUT_S; then any stand-in
    trainer of this data dir that outlived it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for info in data_dir.glob(f"runs/*/{RUN_JSON}"):
        with suppress(OSError, ValueError, KeyError, psutil.Error):
            trainer = psutil.Process(int(json.loads(info.read_text())["pid"]))
            if str(STAND_IN) in trainer.cmdline():
                trainer.kill()


def start_pair(api: httpx.Client) -> tuple[str, list[str]]:
    """A `quick` pair, once both runs are running and have written a step."""
    created = api.post("/api/pairs", json={"preset": "quick"})
    created.raise_for_status()
    pair = str(created.json()["pair"])
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        runs = api.get(f"/api/pairs/{pair}").json()["runs"]
        if all(r["state"] == "running" and (r["step"] or 0) > 0 for r in runs):
            return pair, [r["id"] for r in runs]
        if time.monotonic() > deadline:
            sys.exit(f"the runs did not start: {[(r['state'], r['stage']) for r in runs]}")
        time.sleep(0.1)


def records_written(data_dir: Path, lo: float, hi: float) -> int:
    """Records the trainers wrote with lo ≤ t ≤ hi."""
    n = 0
    for path in data_dir.glob(f"runs/*/{RECORDS_FILE}"):
        for line in path.read_bytes().splitlines():
            with suppress(ValueError):
                n += lo <= float(json.loads(line).get("t", -1)) <= hi
    return n


# -- measuring


async def follow(port: int, pair: str, stream: Stream) -> None:
    try:
        async for frames, now in sse_frames(port, pair):
            stream.hello = stream.hello or b"event: hello" in frames
            stream.gaps += frames.count(b'"gap":true')
            stream.seen.extend((float(t), now) for _id, _run, _kind, t in RECORD.findall(frames))
    except (OSError, asyncio.IncompleteReadError) as e:
        stream.error = repr(e)


async def timed_get(client: httpx.AsyncClient, path: str, out: Latencies) -> None:
    t0 = time.perf_counter()
    try:
        (await client.get(path)).raise_for_status()
    except httpx.TimeoutException:
        out.timeouts += 1
    except httpx.HTTPError:
        out.errors += 1
        return
    out.seconds.append(time.perf_counter() - t0)


async def sample(
    client: httpx.AsyncClient, path: str, every_s: float, seconds: float, out: Latencies
) -> None:
    """GET `path` every `every_s` for `seconds`, each request on schedule even while the
    previous ones still wait (a client that waits would skip the slow moments)."""
    loop = asyncio.get_running_loop()
    t0, tasks = loop.time(), []
    for k in range(math.ceil(seconds / every_s)):
        await asyncio.sleep(max(0.0, t0 + k * every_s - loop.time()))
        tasks.append(asyncio.create_task(timed_get(client, path, out)))
    await asyncio.gather(*tasks)


async def observe(
    port: int,
    pair: str,
    cookies: httpx.Cookies,
    server_pid: int,
    args: argparse.Namespace,
) -> Observed:
    stream = Stream()
    follower = asyncio.create_task(follow(port, pair, stream))
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=50)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        cookies=cookies,
        timeout=REQUEST_TIMEOUT_S,
        limits=limits,
    ) as client:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not stream.hello:
            if follower.done() or time.monotonic() > deadline:
                sys.exit(f"the SSE stream did not say hello: {stream.error}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # settle
        presets, pair_view = Latencies(), Latencies()
        server = psutil.Process(server_pid)
        cpu0, t0 = sum(server.cpu_times()[:2]), time.monotonic()
        start = time.time()
        await asyncio.gather(
            sample(client, "/api/presets", args.sample_s, args.seconds, presets),
            sample(client, f"/api/pairs/{pair}", args.pair_every_s, args.seconds, pair_view),
        )
        cpu1, t1 = sum(server.cpu_times()[:2]), time.monotonic()
        await asyncio.sleep(1.0)  # the last records of the window arrive
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    cpu_pct = 100 * (cpu1 - cpu0) / (t1 - t0)
    return Observed(presets, pair_view, stream, start, cpu_pct)


def spread(seconds: list[float]) -> tuple[float, float, float]:
    """(p50, p99, max) in ms; NaN without samples."""
    if not seconds:
        return (math.nan,) * 3
    if len(seconds) == 1:
        return (seconds[0] * 1000,) * 3
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return q[49] * 1000, q[98] * 1000, max(seconds) * 1000


def ms(spread_ms: tuple[float, float, float]) -> str:
    return " ".join(f"{x:>6.0f}" for x in spread_ms)


def measure(pg: PostgresServer, delay_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.create_database("remote")
    steps = int((args.seconds + SETUP_MARGIN_S) / args.step_s)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="crashdrill-remote-db-") as tmp,
            proxied(pg.port, delay_ms / 1000) as proxy_port,
        ):
            data_dir, port = Path(tmp), free_port()
            server = start_server(data_dir, port, via(url, proxy_port), args.step_s, steps)
            try:
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_S
                ) as api:
                    pair, runs = start_pair(api)
                    seen = asyncio.run(observe(port, pair, api.cookies, server.pid, args))
                    for run in runs:
                        with suppress(httpx.HTTPError):
                            api.post(f"/api/runs/{run}/stop")
                lo, hi = seen.start, seen.start + args.seconds
                written = records_written(data_dir, lo, hi)
            finally:
                stop_server(server, data_dir)
    finally:
        pg.drop_database(url)
    delays = [got - t for t, got in seen.stream.seen if lo <= t <= hi]
    return {
        "delay_ms": delay_ms,
        "presets": spread(seen.presets.seconds),
        "pair": spread(seen.pair.seconds),
        "record": spread(delays),
        "received_per_s": len(delays) / args.seconds,
        "written_per_s": written / args.seconds,
        "server_cpu_pct": seen.server_cpu_pct,
        "timeouts": seen.presets.timeouts + seen.pair.timeouts,
        "errors": seen.presets.errors + seen.pair.errors,
        "gaps": seen.stream.gaps,
        "stream_error": seen.stream.error,
    }


def nothing_measured(r: dict[str, Any]) -> str:
    """Why the row of `r` would be empty ("" when it is not)."""
    why = []
    if math.isnan(r["presets"][0]) or math.isnan(r["pair"][0]):
        why.append(f"no request was answered ({r['errors']} errors)")
    if math.isnan(r["record"][0]):
        stream = f" (stream: {r['stream_error']})" if r["stream_error"] else ""
        why.append(
            f"no record of the window reached the stream; {r['written_per_s']:.0f}/s written"
            + stream
        )
    return "; ".join(why)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 5.0, 15.0])
    p.add_argument("--seconds", type=float, default=15.0, help="measurement window per delay")
    p.add_argument("--step-s", type=float, default=0.01, help="seconds between records per run")
    p.add_argument("--sample-s", type=float, default=0.05, help="GET /api/presets every …")
    p.add_argument("--pair-every-s", type=float, default=0.2, help="GET /api/pairs/{pair} every …")
    p.add_argument("--smoke", action="store_true", help="CI size: one 5 ms delay, a 2 s window")
    args = p.parse_args()
    if args.smoke:
        args.delays_ms, args.seconds = [5.0], 2.0
    if any(d < 0 for d in args.delays_ms) or min(args.seconds, args.step_s, args.sample_s) <= 0:
        p.error("delays must be ≥ 0; --seconds, --step-s and --sample-s > 0")
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
        f" 2 runs × {1 / args.step_s:.0f} records/s; {args.seconds:.0f} s per delay;"
        f" /api/presets every {args.sample_s * 1000:.0f} ms,"
        f" /api/pairs/{{pair}} every {args.pair_every_s * 1000:.0f} ms",
        flush=True,
    )
    print(
        f"{'one-way':>7} {'RTT':>4} | {'/api/presets ms':^20} | {'/api/pairs/{pair} ms':^20}"
        f" | {'SSE record delay ms':^20} | {'records/s':^11} | {'server':>6}",
        flush=True,
    )
    p50s = f"{'p50':>6} {'p99':>6} {'max':>6}"
    print(
        f"{'ms':>7} {'ms':>4} | {p50s} | {p50s} | {p50s} | {'recv':>5} {'wrote':>5} | {'CPU':>6}",
        flush=True,
    )
    with PostgresServer.start() as pg:
        for delay_ms in args.delays_ms:
            r = measure(pg, delay_ms, args)
            if empty := nothing_measured(r):
                print(f"{delay_ms:>7.0f} ms one way: nothing measured: {empty}", flush=True)
                return 1
            notes = [f"{r[k]} {k}" for k in ("errors", "gaps") if r[k]]
            if r["timeouts"]:
                notes.append(f"{r['timeouts']} timed out, counted as {REQUEST_TIMEOUT_S} s")
            notes += [f"stream: {r['stream_error']}"] if r["stream_error"] else []
            print(
                f"{delay_ms:>7.0f} {2 * delay_ms:>4.0f} | {ms(r['presets'])} | {ms(r['pair'])}"
                f" | {ms(r['record'])} | {r['received_per_s']:>5.0f} {r['written_per_s']:>5.0f}"
                f" | {r['server_cpu_pct']:>5.0f}%" + (f"  ({'; '.join(notes)})" if notes else ""),
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

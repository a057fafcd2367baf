"""SSE fan-out: N clients on loopback follow one pair; how late does each record arrive?

    python benchmarks/stream_fanout.py                      # N = 50, 200, 500
    python benchmarks/stream_fanout.py --clients 200 --seconds 20 --step-s 0.005
    python benchmarks/stream_fanout.py --smoke              # CI size: 80 clients, 2 s

For each N: a fresh server subprocess (`python -m crashdrill.server`) whose runs are
stand-in trainers (`tests/support/stand_in_trainer.py`, a test double) writing one step record every
`--step-s` seconds each (default 0.01: 100 records/s per run, like the real `quick`
trainer on one core); N SSE clients in this process connect to /api/stream?pair=…; for
`--seconds` the benchmark measures, per record, the delay from the `t` the trainer wrote
into records.jsonl to the moment a client parsed it, and the server process's CPU time.
The lab caps open streams per client address (stream_max_per_address, 64), as a class's
browsers would come from many: each client binds its own loopback source address,
`--per-address` clients to one (127.0.0.2, 127.0.0.3, …). Each size has a deadline for
its clients to connect (`--connect-timeout-s`); a client the server refuses is counted.
It prints p50/p99/max delay, how many clients received every record of the window, and
the server's CPU (100% = one core). Target: p99 ≤ 100 ms at 200 clients. When no record
of the window reached any client it says so instead of a row, and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from sse_frames import loopback_source, sse_frames  # a sibling: benchmarks run as scripts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support is not installed
from tests.support.lab import spawn_server

RECORD = re.compile(rb'"id":(\d+),"run":"([^"]+)","v":1,"kind":"[a-z]+","t":([0-9.e+-]+)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Client:
    seen: list[tuple[int, float, float]] = field(default_factory=list)  # (id, t, received)
    gaps: int = 0
    hello: bool = False
    error: str | None = None


async def follow(port: int, pair: str, source: str, client: Client) -> None:
    try:
        async for frames, now in sse_frames(port, pair, source):
            if not client.hello and b"event: hello" in frames:
                client.hello = True
            if b'"gap":true' in frames:
                client.gaps += 1
            client.seen.extend((int(rid), float(t), now) for rid, _run, t in RECORD.findall(frames))
    except (OSError, asyncio.IncompleteReadError) as e:
        client.error = repr(e)


STAND_IN = Path(__file__).resolve().parents[1] / "tests" / "support" / "stand_in_trainer.py"


def start_server(data_dir: Path, port: int, step_s: float, steps: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CRASHDRILL_DATA_DIR": str(data_dir),
        "CRASHDRILL_TRAINER_COMMAND": f"{sys.executable} {STAND_IN}",
        "CRASHDRILL_STANDIN_STEPS": str(steps),
        "CRASHDRILL_STANDIN_STEP_S": str(step_s),
        "CRASHDRILL_STANDIN_CKPT_EVERY": "1000000",
        # a trainer inherits only allowlisted variables (workers/trainer_env.py): without
        # this the stand-in ran its default 60 steps and was done before the window
        "CRASHDRILL_TRAINER_ENV_PASS": "CRASHDRILL_STANDIN_*",
    }
    try:
        return spawn_server(port, env, data_dir / "server.log", "--log-level", "warning")
    except AssertionError as e:
        sys.exit(f"server did not start: {e}")


def client_worker(
    port: int,
    pair: str,
    first: int,
    n: int,
    per_address: int,
    connect_timeout_s: float,
    window: Any,
    ready: Any,
    done: Any,
    results: Any,
) -> None:
    """One process with clients `first` … `first + n - 1`, each from its loopback source
    address; reports ids, delays and its own CPU time. Ready once every client said hello
    or failed, or after `connect_timeout_s`."""

    async def run() -> None:
        clients = [Client() for _ in range(n)]
        tasks = []
        deadline = time.monotonic() + connect_timeout_s
        for i, c in enumerate(clients):
            source = loopback_source(first + i, per_address)
            tasks.append(asyncio.create_task(follow(port, pair, source, c)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        while sum(c.hello or c.error is not None for c in clients) < n:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        ready.release()
        while window[0] == 0.0:
            await asyncio.sleep(0.01)
        lo, hi = window[0], window[1]
        cpu0 = sum(os.times()[:2])
        while not done.is_set():
            await asyncio.sleep(0.05)
        cpu = sum(os.times()[:2]) - cpu0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        results.put(
            (
                [sorted(i for i, t, _ in c.seen if lo <= t <= hi) for c in clients],
                [now - t for c in clients for _, t, now in c.seen if lo <= t <= hi],
                sum(c.gaps for c in clients),
                sum(1 for c in clients if c.error),
                cpu,
                sum(1 for c in clients if c.hello),
                sorted({c.error for c in clients if c.error}),
            )
        )

    asyncio.run(run())


class NothingMeasured(Exception):
    """A size at which no record of the window reached a client; the message says why."""


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    seconds, step_s, procs = args.seconds, args.step_s, args.procs
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="crashdrill-fanout-") as tmp:
        port = free_port()
        steps = int((seconds + args.connect_timeout_s + 30) / step_s)
        server = start_server(Path(tmp), port, step_s, steps)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as api:
                made = api.post("/api/pairs", json={"preset": "quick"})
                if made.status_code != 201:
                    raise NothingMeasured(f"the lab refused the pair: {made.status_code}")
                pair = made.json()["pair"]
                deadline = time.monotonic() + 60
                while True:
                    runs = api.get(f"/api/pairs/{pair}").json()["runs"]
                    if all(r["state"] == "running" and (r["step"] or 0) > 0 for r in runs):
                        break
                    if time.monotonic() > deadline:
                        states = [(r["state"], r["step"]) for r in runs]
                        raise NothingMeasured(f"the runs did not train within 60 s: {states}")
                    time.sleep(0.1)
                window = ctx.Array("d", [0.0, 0.0])
                ready, done, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
                shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
                firsts = [sum(shares[:i]) for i in range(procs)]
                sizes = (args.per_address, args.connect_timeout_s)
                workers = [
                    ctx.Process(
                        target=client_worker,
                        args=(port, pair, first, k, *sizes, window, ready, done, results),
                    )
                    for first, k in zip(firsts, shares, strict=True)
                    if k
                ]
                for w in workers:
                    w.start()
                for _ in workers:  # each waits at most connect_timeout_s, after its start
                    if not ready.acquire(timeout=args.connect_timeout_s + 60):
                        raise NothingMeasured("a client process did not report in time")
                time.sleep(1.0)  # settle
                ps = psutil.Process(server.pid)
                cpu0, t0 = sum(ps.cpu_times()[:2]), time.monotonic()
                start = time.time()
                window[1] = start + seconds
                window[0] = start
                time.sleep(seconds)
                cpu1, t1 = sum(ps.cpu_times()[:2]), time.monotonic()
                time.sleep(1.0)  # the last records of the window arrive
                done.set()
                got = [results.get(timeout=60) for _ in workers]
                for w in workers:
                    w.join(30)
                    if w.is_alive():
                        w.kill()
                expected: set[int] = set()
                for run in runs:
                    page = api.get(
                        f"/api/runs/{run['id']}/records", params={"limit": 20000}
                    ).json()["records"]
                    expected |= {r["id"] for r in page if start <= r["t"] <= start + seconds}
                for run in runs:
                    api.post(f"/api/runs/{run['id']}/stop")
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
    delays = sorted(d for g in got for d in g[1])
    connected = sum(g[5] for g in got)
    refusals = sorted({e for g in got for e in g[6]})
    if not expected or not delays:
        why = (
            "the trainers wrote no record in the window"
            if not expected
            else f"no record of the window reached any of the {connected} connected clients"
        )
        raise NothingMeasured(
            f"{why} ({connected} of {n} clients connected"
            + (f"; errors: {', '.join(refusals)[:300]}" if refusals else "")
            + ")"
        )
    complete = sum(1 for g in got for ids in g[0] if expected <= set(ids))
    q = statistics.quantiles(delays, n=100) if len(delays) > 1 else delays * 99
    return {
        "clients": n,
        "records": len(expected),
        "complete": complete,
        "gaps": sum(g[2] for g in got),
        "errors": sum(g[3] for g in got),
        "connected": connected,
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": delays[-1] * 1000 if delays else 0.0,
        "server_cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "client_cpu_pct": 100 * sum(g[4] for g in got) / (t1 - t0 + 1.0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[50, 200, 500])
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window per N")
    p.add_argument("--step-s", type=float, default=0.01, help="seconds between records per run")
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument(
        "--per-address",
        type=int,
        default=50,
        help="clients sharing one loopback source address (the lab allows 64 streams each)",
    )
    p.add_argument(
        "--connect-timeout-s", type=float, default=60.0, help="deadline for clients to connect"
    )
    p.add_argument("--smoke", action="store_true", help="CI size: 80 clients (2 addresses), 2 s")
    args = p.parse_args()
    if args.smoke:
        args.clients, args.seconds, args.connect_timeout_s = [80], 2.0, 30.0
    if args.per_address < 1 or min(args.clients) < 1 or args.seconds <= 0:
        p.error("--per-address and --clients ≥ 1, --seconds > 0")
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
        f" 2 runs × {1 / args.step_s:.0f} records/s; {args.seconds:.0f} s per measurement;"
        f" {args.procs} client processes",
        flush=True,
    )
    print(
        f"{'clients':>7} {'records':>7} {'complete':>9} {'gaps':>5} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7} {'server CPU':>10} {'client CPU':>10}",
        flush=True,
    )
    for n in args.clients:
        try:
            r = measure(n, args)
        except NothingMeasured as e:
            print(f"{n:>7} clients: nothing measured: {e}", flush=True)
            return 1
        print(
            f"{r['clients']:>7} {r['records']:>7} {r['complete']:>5}/{n:<3} {r['gaps']:>5}"
            f" {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f}"
            f" {r['server_cpu_pct']:>9.0f}% {r['client_cpu_pct']:>9.0f}%"
            + (f"  ({r['errors']} errors, {r['connected']} connected)" if r["errors"] else ""),
            flush=True,
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

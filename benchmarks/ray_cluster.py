"""The lab on a 3-node Ray cluster on this machine against the local executor.

    python benchmarks/ray_cluster.py                 # both executors, 3 quick pairs each
    python benchmarks/ray_cluster.py --executors ray --pairs 2

For each executor a fresh server subprocess (`python -m crashdrill.server`, telemetry off,
`--max-concurrent` = 2 × pairs) and the same load: `--pairs` pairs of `quick` (6 runs by
default, the real trainer). For Ray, a cluster on 127.0.0.1 started here with
ray.cluster_utils.Cluster (a head with no CPUs, 3 worker nodes of 2 CPUs) and a mirror
directory. It measures, for one run each:
- record written → visible in GET /api/runs/{run}/records: polled every 20 ms, per step
  record the time it was first seen minus the `t` the trainer wrote (p50/p99);
- crash → first recomputed step: from POST …/crash to the `t` of the first step record
  of the next segment;
- host lost → first recomputed step on the new node (Ray only): from remove_node of the
  run's node to the `t` of its next segment's first step;
- the server's CPU (100 % = one core) over `--cpu-window-s` once every run trains.
It prints one row per executor. On a 2-core machine 6 runs share 2 cores: the numbers
are for comparing the executors on the same load, not for a real cluster.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support is not installed

from tests.support.lab import free_port, spawn_server  # noqa: E402


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RecordWatch(threading.Thread):
    """Polls one run's records; notes when each step record was first seen."""

    def __init__(self, client: httpx.Client, run: str) -> None:
        super().__init__(daemon=True)
        self.client, self.run_id = client, run
        self.after = 0
        self.delays: list[float] = []
        self.steps: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                page = self.client.get(
                    f"/api/runs/{self.run_id}/records", params={"after": self.after, "limit": 5000}
                ).json()
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            now = time.time()
            for rec in page["records"]:
                if rec["kind"] == "step":
                    self.delays.append(now - rec["t"])
                    self.steps.append(rec)
            if page["records"]:
                self.after = page["next_after"]
            time.sleep(0.02)

    def first_step_of(self, segment: int, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in list(self.steps):
                if rec["segment"] == segment:
                    return rec
            time.sleep(0.02)
        raise TimeoutError(f"no step of segment {segment} in {timeout:.0f}s")


def wait_runs(client: httpx.Client, pair: str, ok: Any, timeout: float = 300) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        runs = client.get(f"/api/pairs/{pair}").json()["runs"]
        if ok(runs):
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(str([(r["state"], r["step"]) for r in runs]))
        time.sleep(0.1)


def measure(
    executor: str, pairs: int, work: Path, cluster: Any, cpu_window_s: float
) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "CRASHDRILL_DATA_DIR": str(work / executor / "lab"),
        "CRASHDRILL_TELEMETRY": "0",
        "CRASHDRILL_MAX_CONCURRENT": str(2 * pairs),
        "CRASHDRILL_MIRROR": str(work / executor / "mirror"),
    }
    if cluster is not None:
        env["CRASHDRILL_RAY_ADDRESS"] = cluster.address
    log = work / f"{executor}.log"
    server = spawn_server(port, env, log, start_timeout=120)
    out: dict[str, Any] = {"executor": executor}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            created = [
                client.post("/api/pairs", json={"preset": "quick"}).json() for _ in range(pairs)
            ]
            first = created[0]
            run_a, run_b = (r["id"] for r in first["runs"])
            watch_a, watch_b = RecordWatch(client, run_a), RecordWatch(client, run_b)
            watch_a.start()
            watch_b.start()
            for c in created:
                wait_runs(client, c["pair"], lambda rs: all((r["step"] or 0) >= 5 for r in rs))
            proc = psutil.Process(server.pid)
            proc.cpu_percent(None)
            time.sleep(cpu_window_s)  # all 2 x pairs runs train meanwhile
            out["server_cpu_pct"] = proc.cpu_percent(None)
            wait_runs(client, first["pair"], lambda rs: all((r["step"] or 0) >= 60 for r in rs))
            t0 = time.time()
            assert client.post(f"/api/runs/{run_a}/crash").status_code == 202
            out["crash_to_first_recomputed_s"] = watch_a.first_step_of(1)["t"] - t0
            if cluster is not None:
                host = client.get(f"/api/pairs/{first['pair']}").json()["runs"][1]["host"]
                node = next(n for n in cluster.worker_nodes if n.node_id == host["node_id"])
                t0 = time.time()
                cluster.remove_node(node)
                out["host_lost_to_first_recomputed_s"] = watch_b.first_step_of(1)["t"] - t0
            for c in created:
                wait_runs(client, c["pair"], lambda rs: all(r["state"] != "running" for r in rs))
            watch_a.stop.set()
            watch_b.stop.set()
            delays = watch_a.delays + watch_b.delays
            out["record_visible_p50_ms"] = 1000 * pct(delays, 0.5)
            out["record_visible_p99_ms"] = 1000 * pct(delays, 0.99)
            out["records"] = len(delays)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--executors", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    p.add_argument("--pairs", type=int, default=3, help="quick pairs trained at once")
    p.add_argument(
        "--cpu-window-s", type=float, default=10.0, help="how long the server's CPU is measured"
    )
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="crashdrill-ray-bench-") as tmp:
        for executor in args.executors:
            cluster = None
            if executor == "ray":
                from tests.support import ray_cluster

                t = time.monotonic()
                cluster = ray_cluster.start_cluster(nodes=3)
                print(f"cluster of 3 nodes up in {time.monotonic() - t:.1f}s", flush=True)
            try:
                rows.append(measure(executor, args.pairs, Path(tmp), cluster, args.cpu_window_s))
            finally:
                if cluster is not None:
                    cluster.shutdown()
            print(rows[-1], flush=True)
    print()
    print(
        "executor  crash→recomputed  host lost→recomputed  record visible p50/p99"
        "  server CPU (6 runs)"
    )
    for r in rows:
        lost = r.get("host_lost_to_first_recomputed_s")
        print(
            f"{r['executor']:<8}  {r['crash_to_first_recomputed_s']:>14.2f}s"
            f"  {(f'{lost:.2f}s' if lost is not None else '—'):>20}"
            f"  {r['record_visible_p50_ms']:>10.0f}/{r['record_visible_p99_ms']:.0f} ms"
            f"  {r['server_cpu_pct']:>8.1f} %"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

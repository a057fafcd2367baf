"""A class of students crash-testing `quick` pairs at once, on the local executor and on
a 3-node Ray cluster on this machine.

    python benchmarks/class_load.py                          # 30 students over 60 s, both
    python benchmarks/class_load.py --students 4 --window-s 10 --executors local
    python benchmarks/class_load.py --smoke                  # 3 students, local: < 1 min
    python benchmarks/class_load.py --students 10 --ranks 2 --executors ray   # 2-rank runs

For each executor a fresh server subprocess (`python -m crashdrill.server --log-level
warning`, the real trainer) with the settings a class would run it with: the defaults
(as many runs at once as the machine carries, server/admission.py; the per-address and
per-browser quota of 3 pairs, 64 streams per address, the machine sampler on, the local
checkpoint mirror), and on Ray `--ray` with a mirror directory every node reaches and no
`max_concurrent` (the cluster's nodes are the queue). The Ray cluster is started here with
ray.cluster_utils.Cluster as the Ray tests do (tests/support/ray_cluster.py: every node on
127.0.0.1, no dashboard, a head with no CPUs and 3 worker nodes of 2 CPUs).

`--ranks 2` gives every student a pair of lesson 1.16 instead (two runs of 2 ranks each,
crash mode kill; run A, the one crashed, saves every rank's state): on Ray each run's
ranks are one placement group packed on a node (docs/cluster.md), so the 3 nodes train
3 such runs at once and the rest wait for a node.

The students (benchmarks/class_student.py) arrive at times drawn from `--seed` over
`--window-s`, each from its own loopback address (127.0.0.2, .3, …: the quotas are per
address) with its own cookie jar. Each starts a `quick` pair, follows its event stream as
the page does, reads GET /api/pairs/{pair} every `--poll-s`, presses Crash test on run A
at a step drawn from its own RNG past A's first checkpoint (the first `ckpt` record on the
stream: quick's trainer writes one at step 0, so any step 1 … steps-1) when the stream
shows that step, and waits for the resume check; a run that ends first is a missed crash.
Meanwhile the server's process tree is sampled every 0.5 s (psutil). Per executor it
prints (benchmarks/class_report.py):
- queue wait: from POST /api/pairs until the stream shows the run out of state `queued`
  (on Ray there is no lab queue: waiting for a node is part of the next figure);
- start → first step: from then until the run's first step record arrives on the stream;
- crash → first recomputed step: from POST …/crash until the first step record of the
  next segment arrives on the stream; crash → verdict: until the complete resume check;
- record written → received: arrival on the stream minus the record's `t`, every record;
- GET /api/pairs/{pair}: the students' reads while the class runs;
- 5xx answers; records lost or repeated on the stream and in the records API against each
  run's records.jsonl (benchmarks/class_audit.py); verdicts bit-identical;
- the server's CPU (100 % = one core) over the class, and the peak RSS of the server and
  of all trainers together (on the local executor every process the server started; on
  Ray the processes training the class's runs).
It exits 1 when a check fails (a 5xx, a refused pair, a failed run, a lost or repeated
record, a resume that is not bit-identical) or when no student got a verdict; timings are
printed against the targets of issue #22, never judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from class_report import checks, report, summarize  # siblings: benchmarks run as scripts
from class_student import Student

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support is not installed

from tests.support.lab import free_port, spawn_server, stop_server  # noqa: E402

PRESET = "quick"
PRESET_OF_RANKS = {1: PRESET, 2: "lesson-1.16"}  # --ranks: a pair whose runs have that many
SAMPLE_S = 0.5
RUN_LIMIT = re.compile(r"; ([^;]*runs at once[^;]*);")  # the server's start line
MB = 1024 * 1024


class TreeSampler(threading.Thread):
    """Every SAMPLE_S: the server's RSS, and the RSS of the trainers together (`trainers()`
    says which processes those are)."""

    def __init__(self, server: psutil.Process, trainers: Any) -> None:
        super().__init__(daemon=True)
        self.server, self.trainers = server, trainers
        self.server_peak = self.trainers_peak = 0
        self.most_trainers = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            total = count = 0
            for proc in self.trainers():
                try:
                    total += proc.memory_info().rss
                    count += 1
                except psutil.Error:
                    continue
            try:
                self.server_peak = max(self.server_peak, self.server.memory_info().rss)
            except psutil.Error:
                return
            self.trainers_peak = max(self.trainers_peak, total)
            self.most_trainers = max(self.most_trainers, count)


def local_trainers(server: psutil.Process) -> Any:
    return lambda: server.children(recursive=True)


def ray_trainers(run_ids: set[str]) -> Any:
    """The processes whose command line trains one of `run_ids` (`--run-dir …/RUN`), with
    their children."""

    def find() -> list[psutil.Process]:
        out = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            at = cmd.index("--run-dir") + 1 if "--run-dir" in cmd[:-1] else 0
            if at and Path(cmd[at]).name in run_ids:
                out.append(proc)
                out.extend(proc.children(recursive=True))
        return out

    return find


async def hold_class(students: list[Student], base_url: str, data_dir: Path, args: Any) -> None:
    async def one(s: Student) -> None:
        await asyncio.sleep(s.arrive_s)
        preset = PRESET_OF_RANKS[args.ranks]
        await s.attend(base_url, data_dir, preset, args.poll_s, args.student_timeout_s)

    await asyncio.gather(*(one(s) for s in students))


def measure(executor: str, args: Any, work: Path, cluster: Any) -> dict[str, Any]:
    data_dir = work / executor / "lab"
    env = {**os.environ, "CRASHDRILL_DATA_DIR": str(data_dir)}
    if cluster is not None:
        env["CRASHDRILL_RAY_ADDRESS"] = cluster.address
        env["CRASHDRILL_MIRROR"] = str(work / executor / "mirror")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    extra = ["--max-concurrent", str(args.max_concurrent)] if args.max_concurrent else []
    extra += ["--allow-overcommit"] if args.allow_overcommit else []
    server = spawn_server(
        port, env, work / f"{executor}.log", "--log-level", "warning", *extra, start_timeout=120
    )
    rng = random.Random(args.seed)
    arrivals = sorted(rng.uniform(0, args.window_s) for _ in range(args.students))
    students = [
        Student(i, f"127.0.0.{i + 2}", arrivals[i], random.Random(f"{args.seed}:{i}"))
        for i in range(args.students)
    ]
    run_ids: set[str] = set()
    proc = psutil.Process(server.pid)
    sampler = TreeSampler(proc, local_trainers(proc) if cluster is None else ray_trainers(run_ids))
    out: dict[str, Any] = {"executor": executor, "students": args.students}
    try:
        limit = RUN_LIMIT.search((work / f"{executor}.log").read_text())
        out["run_limit"] = limit.group(1) if limit else "?"
        load0 = os.getloadavg()[0]
        sampler.start()
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        asyncio.run(
            _with_run_ids(hold_class(students, base_url, data_dir, args), students, run_ids)
        )
        out["class_s"] = time.monotonic() - t0
        out["server_cpu_pct"] = 100 * (sum(proc.cpu_times()[:2]) - cpu0) / out["class_s"]
        out["load_average"] = [load0, os.getloadavg()[0]]
        sampler.stop.set()
        sampler.join(5)
        out["server_peak_rss_mb"] = sampler.server_peak / MB
        out["trainers_peak_rss_mb"] = sampler.trainers_peak / MB
        out["most_trainers"] = sampler.most_trainers
        out.update(summarize(students, base_url, data_dir))
    finally:
        sampler.stop.set()
        stop_server(server)
    return out


async def _with_run_ids(coro: Any, students: list[Student], run_ids: set[str]) -> None:
    """Run the class, telling the sampler each run id as its pair is created."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        for s in students:
            run_ids.update(r.id for r in s.runs.values())
        await asyncio.sleep(SAMPLE_S)
    await task


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--students", type=int, default=30, help="students (at most 250)")
    p.add_argument("--window-s", type=float, default=60.0, help="students arrive over this")
    p.add_argument("--executors", default="local,ray", help="local, ray or local,ray")
    p.add_argument("--seed", type=int, default=0, help="arrivals and crash steps")
    p.add_argument("--poll-s", type=float, default=2.0, help="each student's GET of its pair")
    p.add_argument("--student-timeout-s", type=float, default=900.0)
    p.add_argument(
        "--ranks",
        type=int,
        choices=sorted(PRESET_OF_RANKS),
        default=1,
        help="ranks of every run: 1 (quick) or 2 (lesson 1.16)",
    )
    p.add_argument("--smoke", action="store_true", help="3 students over 3 s, local only")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument(
        "--work-dir",
        type=Path,
        help="keep the labs' data dirs and server logs here (default: a temp dir, deleted)",
    )
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=0,
        help="the lab's run limit (default: the lab's own, what the machine carries; 2 ×"
        " students: a lab sized for its class, clamped to what the machine carries)",
    )
    p.add_argument(
        "--allow-overcommit",
        action="store_true",
        help="keep --max-concurrent above what the machine carries (every run at once)",
    )
    args = p.parse_args()
    if args.smoke:
        args.students, args.window_s, args.executors = 3, 3.0, "local"
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    if not 1 <= args.students <= 250 or not executors or set(executors) - {"local", "ray"}:
        p.error("--students must be 1..250 and --executors local, ray or local,ray")
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
        f" {args.students} students over {args.window_s:.0f} s, seed {args.seed},"
        f" {PRESET_OF_RANKS[args.ranks]} pairs ({args.ranks} rank{'s' * (args.ranks > 1)} a run)",
        flush=True,
    )
    results = []
    keep = contextlib.nullcontext(str(args.work_dir)) if args.work_dir else None
    with keep or tempfile.TemporaryDirectory(prefix="crashdrill-class-") as tmp:
        for executor in executors:
            cluster = None
            if executor == "ray":
                os.environ["CRASHDRILL_NODE_DIR"] = str(Path(tmp) / "nodes")
                from tests.support import ray_cluster

                t = time.monotonic()
                cluster = ray_cluster.start_cluster(nodes=3)
                print(f"Ray cluster of 3 nodes up in {time.monotonic() - t:.1f}s", flush=True)
            try:
                results.append(measure(executor, args, Path(tmp), cluster))
            finally:
                if cluster is not None:
                    cluster.shutdown()
            report(results[-1])
            failed = checks(results[-1])
            results[-1]["failed_checks"] = failed
            for f in failed:
                print(f"  FAILED: {f}")
            if not failed:
                print("  checks: no 5xx, no record lost or repeated, every verdict bit-identical")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args), "results": results},
                indent=2,
                default=str,  # the paths among the arguments
            )
        )
    return 1 if any(r["failed_checks"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

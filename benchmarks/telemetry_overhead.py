"""What the telemetry sampler costs the machine it measures.

    .venv/bin/python benchmarks/telemetry_overhead.py
    .venv/bin/python benchmarks/telemetry_overhead.py --samples 500 --live-seconds 20
    .venv/bin/python benchmarks/telemetry_overhead.py --smoke     # CI size: 20 samples, 1 s live

Two measurements, both in process CPU time (all threads), so they count psutil's /proc
reads and NVML's driver calls but not time spent waiting:
- back to back: `--samples` calls of `sample()` in a loop → µs of CPU per sample;
- live: the real background thread at `--live-interval` for `--live-seconds` while this
  thread sleeps → CPU per sample including the thread's wake-ups.
Both are scaled to the production interval (`--interval`, 2 s) as "% of one core".
A third: what a run of several ranks adds to its views (server/rank_view.py): the ranks
file and liveness read (workers/rank_states.py) and the ProcessSampler's CPU, RSS (and
per-process GPU memory) of `--ranks` stand-in rank processes, back to back, scaled to its
once-a-second reading per run.
The budget is 1 % of one core. A live thread that took no sample measured nothing: the
script says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.rank_states import rank_states
from crashdrill.workers.telemetry import ProcessSampler, TelemetrySample, TelemetrySampler

BUDGET_PCT_OF_ONE_CORE = 1.0


def back_to_back(sampler: TelemetrySampler, samples: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per sample over `samples` calls."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(samples):
        sampler.sample()
    return (
        (time.process_time() - cpu0) / samples,
        (time.perf_counter() - wall0) / samples,
    )


def live(sampler: TelemetrySampler, seconds: float, interval_s: float) -> tuple[float, int]:
    """(CPU seconds per sample, samples taken) with the sampler's own thread running."""
    count = 0

    def on_sample(sample: TelemetrySample) -> None:
        nonlocal count  # only the sampler's thread writes it
        count += 1

    cpu0 = time.process_time()
    sampler.start(on_sample, interval_s=interval_s)
    time.sleep(seconds)
    sampler.stop()
    return (time.process_time() - cpu0) / max(count, 1), count


def rank_reads(ranks: int, reads: int) -> float:
    """CPU seconds per read of one run's rank states and its ranks' process telemetry, over
    `reads` reads of `ranks` sleeping child processes (this process their "launcher")."""
    code = "import time; time.sleep(600)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(ranks)]
    try:
        with tempfile.TemporaryDirectory() as d:
            said = {"launcher": os.getpid(), "world": ranks, "crash_rank": 0,
                    "pids": {str(i): p.pid for i, p in enumerate(procs)}}  # fmt: skip
            (Path(d) / RANKS_FILE).write_text(json.dumps(said))
            sampler = ProcessSampler(min_interval_s=0.0)
            cpu0 = time.process_time()
            for _ in range(reads):
                states = rank_states(Path(d), "running", "train", trainer_pid=os.getpid(),
                                     world=ranks)  # fmt: skip
                sampler.read([s.pid for s in states if s.pid is not None])
            sampler.close()
            return (time.process_time() - cpu0) / reads
    finally:
        for p in procs:
            p.kill()
            p.wait()


def pct_of_one_core(cpu_s_per_sample: float, interval_s: float) -> float:
    return cpu_s_per_sample / interval_s * 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--interval", type=float, default=2.0, help="production interval, s")
    parser.add_argument("--live-seconds", type=float, default=10.0)
    parser.add_argument("--live-interval", type=float, default=0.5)
    parser.add_argument("--ranks", type=int, default=2, help="rank processes a run reads")
    parser.add_argument("--smoke", action="store_true", help="CI size: 20 samples, 1 s live")
    args = parser.parse_args()
    if args.smoke:
        args.samples, args.live_seconds, args.live_interval = 20, 1.0, 0.2
    if args.samples < 1 or args.live_seconds <= 0 or args.live_interval <= 0:
        parser.error("--samples ≥ 1, --live-seconds and --live-interval > 0")

    sampler = TelemetrySampler()
    first = sampler.sample()  # opens baselines (and RAPL discovery); not timed
    print(f"gpu_state={first.gpu_state} gpu={first.gpu_name} energy={first.energy_source}")
    if first.gpu_reason:
        print(f"  ({first.gpu_reason})")

    cpu_s, wall_s = back_to_back(sampler, args.samples)
    pct = pct_of_one_core(cpu_s, args.interval)
    print(
        f"back to back, {args.samples} samples: {cpu_s * 1e6:.0f} µs CPU/sample, "
        f"{wall_s * 1e6:.0f} µs wall/sample → {pct:.4f} % of one core at a "
        f"{args.interval:g} s interval"
    )

    live_cpu_s, taken = live(sampler, args.live_seconds, args.live_interval)
    if taken == 0:
        print(
            f"live thread: no sample in {args.live_seconds:g} s at a {args.live_interval:g} s"
            " interval: nothing measured"
        )
        sampler.close()
        return 1
    live_pct = pct_of_one_core(live_cpu_s, args.interval)
    print(
        f"live thread, {taken} samples every {args.live_interval:g} s: "
        f"{live_cpu_s * 1e6:.0f} µs CPU/sample → {live_pct:.4f} % of one core at a "
        f"{args.interval:g} s interval"
    )
    rank_cpu_s = rank_reads(args.ranks, args.samples)
    rank_pct = pct_of_one_core(rank_cpu_s, 1.0)  # a run's ranks are read once a second
    print(
        f"a run's {args.ranks} ranks, {args.samples} reads: {rank_cpu_s * 1e6:.0f} µs CPU/read"
        f" → {rank_pct:.4f} % of one core per run at one read a second"
    )
    worst = max(pct, live_pct)
    verdict = "within" if worst < BUDGET_PCT_OF_ONE_CORE else "OVER"
    print(f"{verdict} the {BUDGET_PCT_OF_ONE_CORE:g} % budget (worst {worst:.4f} %)")
    sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

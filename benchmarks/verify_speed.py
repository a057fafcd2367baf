"""How fast is the drill? Wall time of `crashdrill verify --preset quick --kills 2`, process
starts included, and crash-to-first-resumed-step latency.

    python benchmarks/verify_speed.py                       # seeds 1 2 3
    python benchmarks/verify_speed.py --seeds 1 2 3 4 5 --preset quick --kills 2

For each seed it runs the real command in a subprocess (`python -m crashdrill verify …`,
exactly what CI runs) and times it from outside, then reads the drill's JSON report for
the latency of every resume: from the SIGKILL to the moment the drill read the first
step record of the restarted process (its interpreter start, imports, checkpoint load and
first recomputed step). For scale it also times the pieces every trainer process pays:
`import torch`, and one uninterrupted `crashdrill run` of the preset.

Target (issue "crashdrill verify"): the quick drill with 2 kills under 10 s on the 2-core
dev machine. The machine is shared: run it when it is otherwise idle, and read the load
average it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant
    return ru.ru_utime + ru.ru_stime


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, proc


def _stats(xs: list[float]) -> str:
    if not xs:
        return "—"
    return (
        f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n {len(xs)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    py = sys.executable
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{os.cpu_count()} CPUs"
    )

    c0 = _children_cpu()
    t_torch, _ = _timed([py, "-c", "import torch"])
    c1 = _children_cpu()
    with tempfile.TemporaryDirectory() as d:
        t_run, proc = _timed(
            [py, "-m", "crashdrill", "run", args.preset, "--run-dir", d, "--jsonl", "--quiet"]
        )
        c2 = _children_cpu()
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        t_restart, _ = _timed(
            [
                py,
                "-m",
                "crashdrill",
                "run",
                args.preset,
                "--run-dir",
                d,
                "--quiet",
                "--require-checkpoint",
            ]
        )  # resumes at the final step: a process start + checkpoint load, no training
        c3 = _children_cpu()
    print(f"import torch:                             {t_torch:5.2f} s wall, {c1 - c0:5.2f} s CPU")
    print(f"one uninterrupted run of {args.preset:<16} {t_run:5.2f} s wall, {c2 - c1:5.2f} s CPU")
    print(
        f"a start that resumes and trains nothing:  {t_restart:5.2f} s wall, {c3 - c2:5.2f} s CPU"
    )
    print()

    walls, inner, latencies, cpus, chains = [], [], [], [], []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "report.json"
            cmd = [py, "-m", "crashdrill", "verify", "--preset", args.preset]
            cmd += ["--kills", str(args.kills), "--seed", str(seed), "--json", str(out)]
            cpu0 = _children_cpu()
            wall, proc = _timed(cmd)
            cpu = _children_cpu() - cpu0
            if not out.is_file():
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            rep = json.loads(out.read_text())
        walls.append(wall)
        cpus.append(cpu)
        chains.append(rep["crashed"]["cpu_seconds"])
        inner.append(rep["wall_seconds"])
        lat = [r["latency_s"] for r in rep["resumes"] if r["latency_s"] is not None]
        latencies += lat
        kills = ", ".join(
            f"{'write@' if k['in_checkpoint_write'] else '@'}{k['step']}" for k in rep["kills"]
        )
        print(
            f"seed {seed}: {wall:5.2f} s wall (drill's clock {rep['wall_seconds']:.2f} s, "
            f"CPU: all {cpu:.1f} s, crashed chain {rep['crashed']['cpu_seconds']:.1f} s, "
            f"reference {rep['reference']['cpu_seconds']:.1f} s), "
            f"exit {proc.returncode}, kills {kills}, "
            f"recomputed {sum((r['recomputed'] or {}).get('steps', 0) for r in rep['resumes'])} "
            f"steps, latency " + ", ".join(f"{x:.2f} s" for x in lat)
        )
    print()
    print(f"quick drill wall, {args.kills} kills (process starts included): {_stats(walls)}")
    print(f"crash → first resumed step record:                  {_stats(latencies)}")
    print(f"CPU of all processes per drill:                     {_stats(cpus)}")
    print(
        f"CPU of the crashed chain (start, restarts, recompute): {_stats(chains)} — on idle "
        "cores the drill's wall is about this plus the drill's own start"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

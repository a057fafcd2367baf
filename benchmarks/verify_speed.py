"""How fast is the drill? Wall time of `crashdrill verify --preset quick --kills 2`, process
starts included, and crash-to-first-resumed-step latency.

    python benchmarks/verify_speed.py                       # seeds 1 2 3
    python benchmarks/verify_speed.py --seeds 1 2 3 4 5 --preset quick --kills 2
    python benchmarks/verify_speed.py --starts both         # fork server vs exec, alternating
    python benchmarks/verify_speed.py --phases --seeds 1    # where one drill's time goes
    python benchmarks/verify_speed.py --smoke               # CI size: one seed, fork server

For each seed it runs the real command in a subprocess (`python -m crashdrill verify …`,
exactly what CI runs) and times it from outside, then reads the drill's JSON report for
the latency of every resume: from the SIGKILL to the moment the drill read the first
step record of the restarted process (its interpreter start, imports, checkpoint load and
first recomputed step). For scale it also times the pieces every trainer process pays:
`import torch`, and an uninterrupted `crashdrill run` of the preset: once before the
drills, and again before each seed's drill, so that the ratio it prints (the drill's median
wall over the plain run's median, issue #33's target: at most 1.3) compares the two under
the same load.

`--phases` runs each drill in this process instead (its imports are paid already) and
prints its timeline: the fork server's start and imports, each trainer process from its
start to its first step, its kill or its exit, the final comparison, the records, the
report; with the CPU seconds of each process.

Target (issue #17, item 5): the quick drill with 2 kills under 5 s median on the 2-core
dev machine. The machine is shared: run it when it is otherwise idle, and read the load
average it prints. `--starts both` runs every seed once with the fork server (the default)
and once with `--no-fork-server`, one after the other, so both see the same load.
When no resume's latency was measured (no kill landed) it says so and exits 1.
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


def phases(preset: str, kills: int, seed: int) -> None:
    """One drill in this process, as a timeline of its phases (seconds after its start)."""
    from crashdrill.drill.report import table
    from crashdrill.drill.verify import verify_preset

    cpu0 = _children_cpu()
    result = verify_preset(preset, kills=kills, seed=seed)
    t_report = time.monotonic()
    table(result)
    t_report = time.monotonic() - t_report
    cpu = _children_cpu() - cpu0
    t0, ev = result.t0, result.evidence
    rows = [(t, name) for name, t in result.phases.items()]
    segments = [("reference", ev.reference)] + [(f"crashed #{s.index}", s) for s in ev.crashed]
    for name, seg in segments:
        end = "killed" if seg.killed else f"exit {seg.exit_code}"
        rows.append((seg.started - t0, f"{name}: asked to start"))
        if seg.points:
            p0, p1 = seg.points[0], seg.points[-1]
            rows.append((p0.t - t0, f"{name}: first step {p0.step}"))
            rows.append((p1.t - t0, f"{name}: last step {p1.step} ({len(seg.points)} steps)"))
        rows.append((seg.ended - t0, f"{name}: {end}, {seg.cpu_s or 0:.2f} s CPU"))
    print(f"seed {seed}: timeline (s after the drill's start), load {os.getloadavg()[0]:.2f}")
    for t, name in sorted(rows):
        print(f"  {t:6.2f}  {name}")
    seg_cpu = sum(s.cpu_s or 0 for _, s in segments)
    steps = sum(len(s.points) for _, s in segments[1:])
    print(
        f"  report table {t_report:.2f} s; CPU: trainer processes {seg_cpu:.2f} s "
        f"(crashed chain {seg_cpu - (ev.reference.cpu_s or 0):.2f} s for {steps} steps, "
        f"reference {ev.reference.cpu_s or 0:.2f} s for {len(ev.reference.points)}), "
        f"fork server's imports + final comparison {cpu - seg_cpu:.2f} s, "
        f"verdict {result.analysis.verdict}"
    )


def _plain_run(py: str, preset: str) -> tuple[float, float]:
    """Wall and CPU seconds of one uninterrupted `crashdrill run PRESET` in a fresh dir."""
    with tempfile.TemporaryDirectory() as d:
        c0 = _children_cpu()
        wall, proc = _timed([py, "-m", "crashdrill", "run", preset, "--run-dir", d, "--quiet"])
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            raise SystemExit(1)
        return wall, _children_cpu() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--starts",
        choices=["fork", "exec", "both"],
        default="fork",
        help="trainer processes forked from the fork server (default), exec'd, or both",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="run each drill in this process and print where its time went",
    )
    ap.add_argument("--smoke", action="store_true", help="CI size: seed 1 only, fork server")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.starts = [1], "fork"
    if args.phases:
        for seed in args.seeds:
            phases(args.preset, args.kills, seed)
        return 0
    modes = ["fork", "exec"] if args.starts == "both" else [args.starts]
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

    walls: dict[str, list[float]] = {m: [] for m in modes}
    latencies: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    chains: dict[str, list[float]] = {m: [] for m in modes}
    plains = [t_run]  # one plain run before each seed's drills, under the load they see
    for seed in args.seeds:
        plains.append(_plain_run(py, args.preset)[0])
        for mode in modes:
            with tempfile.TemporaryDirectory() as d:
                out = Path(d) / "report.json"
                cmd = [py, "-m", "crashdrill", "verify", "--preset", args.preset]
                cmd += ["--kills", str(args.kills), "--seed", str(seed), "--json", str(out)]
                cmd += ["--no-fork-server"] if mode == "exec" else []
                cpu0 = _children_cpu()
                wall, proc = _timed(cmd)
                cpu = _children_cpu() - cpu0
                if not out.is_file():
                    print(proc.stdout, proc.stderr, file=sys.stderr)
                    return 1
                rep = json.loads(out.read_text())
            walls[mode].append(wall)
            cpus[mode].append(cpu)
            chains[mode].append(rep["crashed"]["cpu_seconds"])
            lat = [r["latency_s"] for r in rep["resumes"] if r["latency_s"] is not None]
            latencies[mode] += lat
            kills = ", ".join(
                f"{'write@' if k['in_checkpoint_write'] else '@'}{k['step']}" for k in rep["kills"]
            )
            print(
                f"seed {seed} ({rep['target'].get('starts', mode)}): {wall:5.2f} s wall "
                f"(drill's clock {rep['wall_seconds']:.2f} s, CPU: all {cpu:.1f} s, "
                f"crashed chain {rep['crashed']['cpu_seconds']:.1f} s, "
                f"reference {rep['reference']['cpu_seconds']:.1f} s), "
                f"exit {proc.returncode}, kills {kills}, recomputed "
                f"{sum((r['recomputed'] or {}).get('steps', 0) for r in rep['resumes'])} steps, "
                f"latency " + ", ".join(f"{x:.2f} s" for x in lat) + f", "
                f"load {os.getloadavg()[0]:.2f}"
            )
    for mode in modes:
        print()
        print(f"[{mode}] quick drill wall, {args.kills} kills: {_stats(walls[mode])}")
        print(f"[{mode}] crash → first resumed step record: {_stats(latencies[mode])}")
        print(f"[{mode}] CPU of all processes per drill:   {_stats(cpus[mode])}")
        print(
            f"[{mode}] CPU of the crashed chain (start, restarts, recompute): "
            f"{_stats(chains[mode])}"
        )
    print(
        "(with the fork server the imports are paid once, by the server, and counted in "
        "'all' but in no segment)"
    )
    print(f"plain `crashdrill run {args.preset}`, before each seed: {_stats(plains)}")
    for mode in modes:
        ratio = statistics.median(walls[mode]) / statistics.median(plains)
        print(f"[{mode}] drill median / plain run median: {ratio:.2f}× (target ≤ 1.3×)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    empty = [mode for mode in modes if not latencies[mode]]
    if empty:
        print(f"[{', '.join(empty)}] no resume latency: no kill landed, nothing measured")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

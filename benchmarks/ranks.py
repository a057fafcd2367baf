"""Runs with several ranks on CPU: throughput, the cost of DCP checkpoints, and what a crash
costs a group, with where a restarted group's seconds go.

    .venv/bin/python benchmarks/ranks.py                      # 1, 2, 4 ranks; 3 crashes of each
    .venv/bin/python benchmarks/ranks.py --ranks 1 2 --crashes 5 --steps 200
    .venv/bin/python benchmarks/ranks.py --smoke              # CI size: 1 and 2 ranks, 1 crash each

Prints:
  1. tokens/s of `crashdrill run quick --set ranks=N` (gloo on CPU, the ranks forked from
     the trainer process, one thread each), from its own step records past the warm-up,
     with a DCP checkpoint every 10 steps: the median save and the share of the training
     time the saves took (a save stalls every rank; it is charged to the step after it);
  2. crash → first recomputed step, as the lab does it (a Supervisor over trainers forked
     from the warm process, workers/warm.py): `kill` (SIGKILL of the run's whole tree) on
     1 and 2 ranks, and `rank` (SIGKILL of rank 1 alone) on 2 ranks, where the launcher
     notices the lost rank, takes the group down and the supervisor restarts it; the
     2-rank figure against the 1-rank one (issue #34: at most 1.5×), and for `rank` how
     long the launcher took to notice;
  3. where a restarted group's seconds go, from the phase lines its launcher and ranks
     print with CRASHDRILL_RANK_PHASES=1 (trainer/ranks.py), medians over the restarts:
     the kill → the supervisor's restart event → the trainer's launcher running, the
     checkpoint found, verified and read once by it → every rank forked → model built →
     the checkpoint's state copied in → init_process_group → DDP built → first update →
     its step record.

Timings only: no target is asserted. The machine is shared (2 cores here): it prints the
load average and the CPU count; read the figures against them. A variant that timed no
step, wrote no checkpoint, or a crash whose restart never recomputed a step measured
nothing: it says which and exits 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from crashdrill.trainer.presets import Crash, Knob, dump_preset, get_preset
from crashdrill.trainer.ranks import LAUNCHER, PHASES_ENV, parse_phases
from crashdrill.trainer.records import read_records
from crashdrill.trainer.run_files import RECORDS_FILE, STDERR_LOG
from crashdrill.workers.launch import Change, Launch
from crashdrill.workers.local_executor import LocalExecutor
from crashdrill.workers.supervisor import Supervisor
from crashdrill.workers.warm import WarmTrainers

WARM = 10  # steps excluded from timing: allocator and cache warm-up
# Evaluation, probes and samples off: the runs time training and checkpoints alone.
OFF = {"eval_every": 10**6, "probe_every": 10**6, "sample_every": 10**6, "sample_tokens": 0}
# The phases of a group's start (trainer/ranks.py, trainer/rank_loop.py), in order:
# (the launcher's or the slowest rank's phase, what the time up to it was spent on).
PHASES = (
    ((LAUNCHER, "read"), "trainer started → launcher (CLI, run dir, dataset, checkpoint read)"),
    ((LAUNCHER, "group"), "launcher ready to fork"),
    ((LAUNCHER, "forked"), "every rank forked (rank 0 opens the TCPStore)"),
    ((None, "data"), "dataset (the launcher's, inherited through the fork)"),
    ((None, "model"), "model and optimizer built"),
    ((None, "found"), "checkpoint found and verified (the launcher's, or by each rank)"),
    ((None, "loaded"), "checkpoint's state restored (from the launcher's read), RNG, cursor"),
    ((None, "joined"), "init_process_group (gloo rendezvous)"),
    ((None, "ddp"), "all ranks agree on the checkpoint; DistributedDataParallel built"),
    ((None, "first_step"), "first update (forward, all_gather, backward)"),
)


class NothingMeasured(Exception):
    """A variant without the steps, checkpoints or restart its figure is made of."""


def _stats(xs: list[float], unit: str = "s", scale: float = 1.0) -> str:
    if not xs:
        return "—"
    m, lo, hi = statistics.median(xs) * scale, min(xs) * scale, max(xs) * scale
    return f"median {m:.2f} {unit} (min {lo:.2f}, max {hi:.2f}, n {len(xs)})"


# ---------------------------------------------------------------- 1. throughput


def throughput(ranks: int, steps: int) -> tuple[float, float, float]:
    """tokens/s (saves included), the median DCP save (s) and the share of the timed
    training time spent saving, from one `crashdrill run quick --set ranks=N`."""
    sets = [f"ranks={ranks}", f"steps={steps}", "ckpt_every=10", f"warmup={min(20, steps)}"]
    sets += [f"{k}={v}" for k, v in OFF.items()]
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "crashdrill", "run", "quick", "--run-dir", d, "--quiet"]
        proc = subprocess.run(
            [*cmd, *(a for s in sets for a in ("--set", s))],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise NothingMeasured(f"{ranks} rank(s): exit {proc.returncode}: {proc.stderr[-800:]}")
        recs, _ = read_records(Path(d) / RECORDS_FILE)
    timed = [r for r in recs if r["kind"] == "step" and r["step"] > WARM]
    saves = [r["seconds"] for r in recs if r["kind"] == "ckpt" and WARM < r["step"] < steps]
    if not timed or not saves:
        raise NothingMeasured(f"{ranks} rank(s): {len(timed)} timed steps, {len(saves)} saves")
    run = next(r for r in recs if r["kind"] == "run")["config"]
    tokens = run["batch"] * run["ctx"] * ranks * len(timed)
    wall = sum(r["dt"] for r in timed)
    return tokens / wall, statistics.median(saves), sum(saves) / wall


# ---------------------------------------------------------------- 2, 3. crashes


def crash_preset(where: Path, ranks: int, steps: int) -> Path:
    """quick on `ranks` ranks, a checkpoint every 20 steps; a rank crash takes rank 1."""
    quick = get_preset("quick")
    run = {**quick.run, "ranks": ranks, "steps": steps, **OFF}
    if ranks > 1:
        run["crash_rank"] = 1
    preset = replace(quick, id="ranks-bench", run=run, knob=Knob("ckpt_every", 20, 40),
                     crash=Crash("kill"), predict=None)  # fmt: skip
    path = where / "ranks-bench.toml"
    path.write_text(dump_preset(preset))
    return path


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / RECORDS_FILE
    return read_records(path)[0] if path.exists() else []


def _wait(what: str, until: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = until()
        if got:
            return got
        time.sleep(0.01)
    raise NothingMeasured(f"{what} did not come within {timeout:.0f} s")


def crash_once(warm: WarmTrainers, ranks: int, mode: str, kill_at: int) -> dict[str, Any]:
    """One crash test of `mode` at step ≥ `kill_at` through the lab's supervisor; the
    seconds from the kill to each thing that followed (and the phases of the restart)."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "run"
        changes: list[tuple[float, Change]] = []  # appended by the supervisor's thread

        def on_change(c: Change) -> None:
            changes.append((time.time(), c))

        launch = Launch(run_dir, str(crash_preset(Path(d), ranks, kill_at + 40)), "A",
                        env={PHASES_ENV: "1"})  # fmt: skip
        sup = Supervisor(launch, on_change, poll_s=0.05, executor=LocalExecutor(warm))
        sup.start()
        try:
            _wait(
                f"step {kill_at}",
                lambda: any(
                    r["kind"] == "step" and r["step"] >= kill_at for r in _records(run_dir)
                ),
                300,
            )
            t_kill = time.time()
            sup.crash(mode)
            first = _wait("the first recomputed step", lambda: next(
                (r for r in _records(run_dir) if r["kind"] == "step" and r["segment"] == 1),
                None), 300)  # fmt: skip
        finally:
            sup.stop("the benchmark")
            sup.join(30)
        recs = _records(run_dir)
        stderr = (run_dir / STDERR_LOG).read_text(errors="replace")
    crash = next(r for r in recs if r.get("code") == "crash")
    running = [t for t, c in changes if c.state == "running"]
    out: dict[str, Any] = {
        "first_record": first["t"] - t_kill,
        "restart_event": crash["t"] - t_kill,
        "running": running[1] - t_kill if len(running) > 1 else None,
        "noticed_s": crash.get("noticed_s"),
        "recomputed_from": first["step"],
    }
    later = [(r, n, t) for r, n, t in parse_phases(stderr) if t > t_kill]
    for (rank, name), _ in PHASES:
        ts = [t for r, n, t in later if n == name and (rank is None or r == rank)]
        out[name] = max(ts) - t_kill if ts else None  # the slowest rank's
    return out


def report_crashes(results: dict[str, list[dict[str, Any]]]) -> None:
    print()
    print("crash → first recomputed step (the lab's supervisor, trainers forked warm):")
    for name, rows in results.items():
        print(f"  {name:<18} {_stats([r['first_record'] for r in rows])}")
    for name, rows in results.items():
        noticed = [r["noticed_s"] for r in rows if r["noticed_s"] is not None]
        if noticed:
            print(f"  {name}: the launcher noticed the lost rank in {_stats(noticed, 'ms', 1000)}")
    one = results.get("kill, 1 rank")
    for name, rows in results.items():
        if one and name != "kill, 1 rank":
            ratio = statistics.median(r["first_record"] for r in rows) / statistics.median(
                r["first_record"] for r in one
            )
            print(f"  {name} / kill, 1 rank: {ratio:.2f}× (issue #34's target ≤ 1.5×)")
    print()
    print("where a restart's seconds go (median s after the kill, the slowest rank's; Δ):")
    for name, rows in results.items():
        print(f"  {name}")
        marks = [("restart_event", "supervisor's restart event (the old tree reaped)")]
        marks += [("running", "trainer process started (warm fork)")]
        marks += [(n, what) for (_, n), what in PHASES]
        marks += [("first_record", "its step record written")]
        before = 0.0
        for key, what in marks:
            xs = [r[key] for r in rows if r.get(key) is not None]
            if not xs:
                continue
            m = statistics.median(xs)
            print(f"    {m:6.3f} s  ({m - before:+7.3f})  {what}")
            before = m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=120, help="steps of each throughput run")
    ap.add_argument("--crashes", type=int, default=3, help="crash tests of each kind")
    ap.add_argument("--smoke", action="store_true", help="CI size: 1 and 2 ranks, 1 crash each")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.steps, args.crashes = [1, 2], 40, 1
    if args.steps <= WARM + 10 or args.crashes < 1 or min(args.ranks) < 1:
        ap.error(f"--steps > {WARM + 10}, --crashes ≥ 1, --ranks each ≥ 1")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average before: {load}, {os.cpu_count()} CPUs")
    print("throughput, quick (2L·64d, ctx 32, batch 4 per rank, 1 thread per rank), "
          f"{args.steps} steps, a DCP checkpoint every 10:")  # fmt: skip
    try:
        for n in args.ranks:
            tps, save, share = throughput(n, args.steps)
            print(f"  {n} rank(s): {tps:8.0f} tokens/s · checkpoint save {save * 1000:6.1f} ms "
                  f"(median) · saves {share * 100:5.1f} % of training")  # fmt: skip
        warm = WarmTrainers(keep_children=True)
        warm.prewarm()
        kinds = [("kill, 1 rank", 1, "kill"), ("kill, 2 ranks", 2, "kill")]
        kinds += [("rank, 2 ranks", 2, "rank")]
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in kinds}
        try:
            for _ in range(args.crashes):  # interleaved: each kind sees the same load
                for name, ranks, mode in kinds:
                    results[name].append(crash_once(warm, ranks, mode, kill_at=25))
        finally:
            warm.close()
    except NothingMeasured as e:
        print(f"measured nothing: {e}")
        return 1
    report_crashes(results)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

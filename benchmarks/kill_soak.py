"""A soak: many kills of one run at seeded points, one in five inside a checkpoint write,
every resume compared bit for bit with an uninterrupted reference.

    python benchmarks/kill_soak.py                                  lesson-1.7-fast, 50 kills
    python benchmarks/kill_soak.py --preset quick --kills 10 --seed 3    a CI-sized soak
    python benchmarks/kill_soak.py --smoke          quick, 5 kills (one inside a checkpoint write)

It runs the real command (`python -m crashdrill verify --preset P --kills K --seed S
--json … --work-dir …`, what a user runs) and then reads both run dirs' records files
(the trainer's append-only JSONL, the lab's source of truth) to check that no record was
lost or written twice across all those kills. It prints:

    kills landed            (planned, landed, inside a checkpoint write)
    resumes bit-identical   (must be all of them)
    bits differing          (resumes whose losses differ in any bit: must be 0)
    records lost            (a step of the reference with no step record in the crashed
                             run, or a gap inside one segment: must be 0)
    records duplicated      (one (segment, step) written twice: must be 0)
    wall time

Exit 0 when every number that must be 0 is 0 and the drill passed; 1 otherwise, and 1
when no kill landed (nothing was measured). Timings
taken on a shared machine say little: take them when it is otherwise idle, and read the
load average it prints.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from crashdrill.trainer.run_files import RECORDS_FILE


def step_records(run_dir: Path) -> tuple[list[tuple[int, int]], int]:
    """(segment, step) of every step record, in file order, and how many lines did not
    parse (a line torn by a kill: it must not be there either)."""
    out: list[tuple[int, int]] = []
    bad = 0
    path = run_dir / RECORDS_FILE
    if not path.is_file():
        return out, bad
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict) and rec.get("kind") == "step":
            out.append((int(rec.get("segment", 0)), int(rec["step"])))
    return out, bad


def record_losses(ref: Path, crashed: Path) -> dict[str, int]:
    ref_recs, ref_bad = step_records(ref)
    recs, bad = step_records(crashed)
    ref_steps = {s for _, s in ref_recs}
    seen = {s for _, s in recs}
    by_segment: dict[int, list[int]] = {}
    for seg, step in recs:
        by_segment.setdefault(seg, []).append(step)
    gaps = 0
    for steps in by_segment.values():
        ordered = sorted(set(steps))
        gaps += sum(b - a - 1 for a, b in itertools.pairwise(ordered) if b > a + 1)
    dup = sum(n - 1 for n in Counter(recs).values() if n > 1)
    return {
        "lost": len(ref_steps - seen) + gaps,
        "duplicated": dup,
        "torn_lines": bad + ref_bad,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--preset", default="lesson-1.7-fast")
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run", default="A", choices=["A", "B"])
    ap.add_argument("--smoke", action="store_true", help="CI size: quick, 5 kills, seed 3")
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.kills, args.seed = "quick", 5, 3

    with tempfile.TemporaryDirectory(prefix="crashdrill-soak-") as tmp:
        report_path, work = Path(tmp) / "report.json", Path(tmp) / "runs"
        cmd = [sys.executable, "-m", "crashdrill", "verify", "--preset", args.preset]
        cmd += ["--run", args.run, "--kills", str(args.kills), "--seed", str(args.seed)]
        cmd += ["--json", str(report_path), "--work-dir", str(work)]
        print("$", " ".join(cmd[1:]), f"  (load average {os.getloadavg()[0]:.2f})", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if not report_path.is_file():
            print(proc.stdout + proc.stderr)
            print(f"no report (exit {proc.returncode})")
            return 1
        rep: dict[str, Any] = json.loads(report_path.read_text())
        records = record_losses(work / "reference", work / "crashed")

    kills = rep["kills"]
    landed = [k for k in kills if k["landed"]]
    in_write = [k for k in landed if k["in_checkpoint_write"]]
    resumes = rep["resumes"]
    identical = [r for r in resumes if r["bit_identical"]]
    differing = [r for r in resumes if r["first_divergent_step"] is not None]
    processes = sum(k.get("processes") or 0 for k in landed)
    print(
        f"kills landed           {len(landed)} of {len(kills)} planned "
        f"({len(in_write)} inside a checkpoint write; {processes} processes killed)"
    )
    print(f"resumes bit-identical  {len(identical)} of {len(resumes)}")
    print(f"bits differing         {len(differing)}")
    print(f"records lost           {records['lost']}")
    print(f"records duplicated     {records['duplicated']}")
    print(f"torn record lines      {records['torn_lines']}")
    print(f"wall time              {wall:.1f} s (drill verdict: {rep['verdict']})")
    for d in rep["diagnosis"]:
        print(f"  {'✗' if d['fails'] else '!'} [{d['code']}] {d['text']}")
    if not landed:
        print("no kill landed: nothing measured")
        return 1
    bad = differing or records["lost"] or records["duplicated"] or records["torn_lines"]
    return 1 if bad or rep["verdict"] != "pass" else 0


if __name__ == "__main__":
    raise SystemExit(main())

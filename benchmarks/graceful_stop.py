"""Graceful stops of the built-in presets: how long the save after a SIGTERM takes against
the grace (the config's stop_grace), measured on real processes.

    .venv/bin/python benchmarks/graceful_stop.py [--preset quick] [--at-step 20] [--json F]
    .venv/bin/python benchmarks/graceful_stop.py --smoke    # CI size: quick's two runs only

For each preset and run (A, B): start `crashdrill run PRESET --jsonl`, send SIGTERM once
it has trained `--at-step` steps, and read the trainer's own `stopped_gracefully` record:
the save time (signal to a complete checkpoint), the checkpoint's size, the grace, and
whether the save fit in it; also SIGTERM to process exit, which is what a platform's
SIGKILL races against. A run with graceful_stop = "off" has no handler and is listed as
such. Prints a table; `--json` writes the rows too. When no run's graceful save was
measured it says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crashdrill.trainer.presets import get_preset, list_presets
from crashdrill.trainer.run_files import RECORDS_FILE, read_records


def measure(preset: str, label: str, at_step: int, work: Path) -> dict[str, Any]:
    """One run of `preset`/`label`, SIGTERMed at `at_step`."""
    run_dir = work / f"{preset}-{label}"
    cmd = [sys.executable, "-m", "crashdrill", "run", preset, "--label", label]
    cmd += ["--run-dir", str(run_dir), "--jsonl", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sent = None
    for line in proc.stdout:
        if json.loads(line)["step"] >= at_step:
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    _, err = proc.communicate(timeout=600)
    exit_s = time.monotonic() - sent if sent is not None else None
    row: dict[str, Any] = {"preset": preset, "label": label, "exit_code": proc.returncode}
    row["sigterm_to_exit_s"] = round(exit_s, 3) if exit_s is not None else None
    records, _ = read_records(run_dir / RECORDS_FILE)
    stops = [r for r in records if r.get("code") == "stopped_gracefully"]
    ckpts = {r["step"]: r for r in records if r["kind"] == "ckpt"}
    run = next((r for r in records if r["kind"] == "run"), {})
    row["params"] = run.get("params")
    row["graceful_stop"] = run.get("config", {}).get("graceful_stop")
    row["grace_s"] = run.get("config", {}).get("stop_grace")
    if stops:
        stop = stops[-1]
        row.update(step=stop["step"], save_s=stop["save_seconds"], within=stop["within_grace"])
        ckpt = ckpts.get(stop["step"])
        row["ckpt_bytes"] = ckpt["bytes"] if ckpt else None
    elif proc.returncode != 75:
        row["note"] = err.strip().splitlines()[-1] if err.strip() else ""
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", action="append", help="a preset id (default: every built-in)")
    p.add_argument("--at-step", type=int, default=20, help="SIGTERM after this many steps")
    p.add_argument("--json", type=Path, help="write the rows to this file")
    p.add_argument("--smoke", action="store_true", help="CI size: the quick preset only")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset = ["quick"]
    presets = args.preset or [pr.id for pr in list_presets()]
    rows = []
    print(
        f"{'preset':<16} {'run':<3} {'params':>9} {'ckpt':>9} {'save':>8} {'grace':>6}"
        f" {'fits':<5} {'SIGTERM→exit':>13}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for preset in presets:
            get_preset(preset)  # an unknown id fails here, not in a subprocess
            for label in ("A", "B"):
                row = measure(preset, label, args.at_step, Path(tmp))
                rows.append(row)
                if "save_s" in row:
                    size = f"{row['ckpt_bytes'] / 1e6:.1f} MB" if row.get("ckpt_bytes") else "-"
                    print(
                        f"{preset:<16} {label:<3} {row['params'] or 0:>9,} {size:>9}"
                        f" {row['save_s']:>7.3f}s {row['grace_s']:>5g}s"
                        f" {'yes' if row['within'] else 'NO':<5} {row['sigterm_to_exit_s']:>12.2f}s"
                    )
                else:
                    why = (
                        "no handler (graceful_stop off)"
                        if row["graceful_stop"] == "off"
                        else (f"exit {row['exit_code']} {row.get('note', '')}")
                    )
                    print(f"{preset:<16} {label:<3} {'':>9} {'':>9} {'-':>8} {'':>6} {why}")
                sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not any("save_s" in row for row in rows):
        print("no run saved after its SIGTERM: nothing measured")
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())

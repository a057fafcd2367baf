"""A test double (not shipped): follows docs/run-contract.md without torch or a model.

    python tests/support/stand_in_trainer.py PRESET --run-dir D [--label A]
        [--require-checkpoint] [--mirror URL (accepted; nothing is mirrored)]

It writes run.json, records.jsonl (stage, run, step, ckpt, resume, event) and checkpoint
directories with a MANIFEST.json, resumes from the newest one, and exits 0 / 3 like the
real trainer, in milliseconds per step. The loss is a pure function of the step, so every
resume is bit-identical unless CRASHDRILL_STANDIN_DRIFT is set. For fast supervisor and server
tests and the fan-out benchmark; integration tests use the real trainer.

Environment: CRASHDRILL_STANDIN_STEPS (default 60), _STEP_S (0.01), _CKPT_EVERY (10),
_STARTUP_S (0), _FAIL_AT (a step at which to die with exit 1 and a traceback through this
file), _DIVERGE_AT (a step whose loss is NaN: written as Python's json writes it, the bare
token NaN, as a script outside the contract would; then the divergence's event and stage
and exit 4, trainer/divergence.py), _DRIFT (a resumed segment adds segment × 1e-4 to the
loss). Graceful stops (trainer/preemption.py's exit 75 and
stopped_gracefully event): _GRACEFUL=1 stops so on SIGTERM, its save taking _SAVE_S (0);
_STOP_AT (a step at which segment 0 stops itself, as a time budget does; every segment
with _STOP_ALWAYS=1). _CHILD=1 starts a helper in a session of its own, as torchrun's
ranks do (its pid in a `standin_child` event), that a kill of the tree must take too.
_WRITE_S (0): how long each checkpoint write takes; started with the lab's
CRASHDRILL_CKPT_ANNOUNCE=1 it says each write's begin and end on stderr as the real trainer
does (trainer/checkpoint_pause.py), so that a hold can be seen to avoid them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from crashdrill.trainer.checkpoint_pause import announces, writing_line, written_line
from crashdrill.trainer.start_line import FRESH_LINE, refused_line, resumed_line


def _env(name: str, default: float) -> float:
    return float(os.environ.get(f"CRASHDRILL_STANDIN_{name}", default))


class _Records:
    def __init__(self, path: Path, segment: int) -> None:
        self.segment = segment
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            os.write(self.fd, b"\n")

    def write(self, kind: str, **fields: Any) -> None:
        rec = {"v": 1, "kind": kind, "t": time.time(), "segment": self.segment, **fields}
        os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())


def _latest_checkpoint(ckpt: Path) -> int | None:
    steps = [
        int(d.name[5:])
        for d in ckpt.glob("step-*")
        if d.name[5:].isdigit() and (d / "MANIFEST.json").is_file()
    ]
    return max(steps) if steps else None


def _loss(step: int, segment: int) -> float:
    drift = segment * 1e-4 if os.environ.get("CRASHDRILL_STANDIN_DRIFT") else 0.0
    return 5.0 / math.sqrt(step) + 0.5 + drift


def _stop_gracefully(rec: _Records, ckpt: Path, step: int, reason: str) -> int:
    t0 = time.monotonic()
    d = ckpt / f"step-{step:08d}"
    if not (d / "MANIFEST.json").is_file():
        time.sleep(_env("SAVE_S", 0))
        d.mkdir(parents=True, exist_ok=True)
        (d / "MANIFEST.json").write_text(json.dumps({"step": step}))
        rec.write("ckpt", step=step, bytes=1, seconds=0.0, path=str(d))
    took = time.monotonic() - t0
    rec.write(
        "event",
        text=f"Stopped gracefully at step {step} after {reason}.",
        level="info",
        code="stopped_gracefully",
        step=step,
        reason=reason,
        checkpoint_step=step,
        save_seconds=took,
        grace_s=30.0,
        within_grace=took <= 30.0,
        mirrored=None,
    )
    print(f"crashdrill: stopped gracefully at step {step} after {reason}", file=sys.stderr)
    return 75


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stand_in_trainer")
    p.add_argument("preset")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--label", default="A")
    p.add_argument("--require-checkpoint", action="store_true")
    p.add_argument("--mirror", help="accepted as the trainer does (the Ray executor passes it)")
    args = p.parse_args(argv)
    steps = int(_env("STEPS", 60))
    step_s = _env("STEP_S", 0.01)
    every = int(_env("CKPT_EVERY", 10))
    fail_at = int(_env("FAIL_AT", -1))
    diverge_at = int(_env("DIVERGE_AT", -1))
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    info_path = run_dir / "run.json"
    try:
        starts = int(json.loads(info_path.read_text()).get("starts", 0))
    except (OSError, ValueError):
        starts = 0
    info: dict[str, Any] = {"pid": os.getpid(), "started_at": time.time(), "starts": starts + 1}
    info.update(label=args.label, preset=args.preset, config={"steps": steps})
    info_path.write_text(json.dumps(info))
    segment = starts
    rec = _Records(run_dir / "records.jsonl", segment)
    stop: dict[str, str] = {}
    if os.environ.get("CRASHDRILL_STANDIN_GRACEFUL"):
        signal.signal(signal.SIGTERM, lambda *_: stop.setdefault("reason", "SIGTERM"))
    stop_at = int(_env("STOP_AT", -1))
    if segment > 0 and not os.environ.get("CRASHDRILL_STANDIN_STOP_ALWAYS"):
        stop_at = -1
    time.sleep(_env("STARTUP_S", 0))
    rec.write("stage", stage="build", progress=1.0)
    rec.write("run", params=0, config={"steps": steps}, device="cpu", threads=1)
    if os.environ.get("CRASHDRILL_STANDIN_CHILD"):
        helper = [sys.executable, "-c", "import time; time.sleep(600)"]
        child = subprocess.Popen(helper, start_new_session=True)
        text = f"Started helper process {child.pid}."
        rec.write("event", text=text, level="info", code="standin_child", pid=child.pid)
    ckpt = run_dir / "ckpt"
    start = _latest_checkpoint(ckpt)
    if start is None:
        if args.require_checkpoint:
            print(refused_line(ckpt), file=sys.stderr)
            rec.write("event", text="Refused to start: no checkpoint.", level="error")
            rec.write("stage", stage="failed", progress=1.0)
            return 3
        print(FRESH_LINE, file=sys.stderr)
        start = 0
        if segment > 0:
            rec.write("resume", from_step=0, segment=segment, path=None)
    else:
        print(resumed_line(start, ckpt / f"step-{start:08d}"), file=sys.stderr)
        rec.write("resume", from_step=start, segment=segment, path=str(ckpt / f"step-{start:08d}"))
        text = f"Resumed at step {start} from a checkpoint."
        rec.write("event", text=text, level="info", code="resumed", step=start, missing=[])
    rec.write("stage", stage="train", progress=start / steps)
    if stop or 0 <= stop_at <= start:
        return _stop_gracefully(rec, ckpt, start, stop.get("reason", "stop_after"))
    for step in range(start + 1, steps + 1):
        if step == fail_at:
            print(
                "Traceback (most recent call last):\n"
                f'  File "{Path(__file__).resolve()}", line 1, in main\n'
                f"RuntimeError: stand-in failure in {run_dir.resolve()}",
                file=sys.stderr,
            )
            return 1
        if step == diverge_at:
            nan = float("nan")
            bits = struct.unpack("<I", struct.pack("<f", nan))[0]
            rec.write("step", step=step, loss=nan, loss_bits=bits, lr=1e-3, grad_norm=nan)
            text = f"Diverged at step {step}: the loss is nan."
            rec.write("event", text=text, level="error", code="diverged", step=step)
            rec.write("stage", stage="diverged", progress=step / steps)
            print(f"crashdrill: diverged at step {step}: the loss is nan; stopped", file=sys.stderr)
            return 4
        loss = _loss(step, segment)
        bits = struct.unpack("<I", struct.pack("<f", loss))[0]
        rec.write("step", step=step, loss=loss, loss_bits=bits, lr=1e-3, tokens=step * 64)
        time.sleep(step_s)
        if step % every == 0:
            say = announces(os.environ)
            if say:
                print(writing_line(step), file=sys.stderr, flush=True)
            time.sleep(_env("WRITE_S", 0))
            d = ckpt / f"step-{step:08d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "MANIFEST.json").write_text(json.dumps({"step": step}))
            if say:
                print(written_line(step), file=sys.stderr, flush=True)
            rec.write("ckpt", step=step, bytes=1, seconds=0.0, path=str(d))
            rec.write(
                "event",
                text=f"Checkpoint at step {step}.",
                level="info",
                code="checkpoint",  # its fields as trainer/event_codes.py says
                step=step,
                bytes=1,
                seconds=0.0,
                persist_seconds=0.0,
                mode="sync",
                parts=["weights"],
            )
        if (stop or step == stop_at) and step < steps:
            return _stop_gracefully(rec, ckpt, step, stop.get("reason", "stop_after"))
    rec.write("stage", stage="finished", progress=1.0)
    rec.write("event", text=f"Finished {steps} steps.", level="info", code="finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

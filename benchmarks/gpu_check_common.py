"""What every part of benchmarks/gpu_check.py shares: how big each part is (a GPU's sizes
and the CPU smoke sizes), the check's context and time budget, and running a command
with a deadline."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What throughput measures is the training step: no eval, probes, samples or checkpoints.
QUIET_RUN = {"eval_every": 10**9, "probe_every": 10**9, "sample_every": 10**9, "sample_tokens": 0}


@dataclass(frozen=True)
class Sizes:
    """How much each part does; `SIZES` on a GPU, `SMOKE` to exercise the code on a CPU."""

    throughput_steps: dict[str, int]
    verify_run: dict[str, Any]  # overrides of `quick` for the drill
    verify_kills: int
    nvml_seconds: float
    nvml_interval_s: float
    lab_preset: str
    lab_steps: int
    lab_crash_step: int  # Crash test once a run's first segment has trained this many steps


SIZES = Sizes(
    throughput_steps={"quick": 1000, "lesson-1.7": 500},
    verify_run={},
    verify_kills=3,
    nvml_seconds=30.0,
    nvml_interval_s=1.0,
    # lesson 1.7 checkpoints every 100 (A) and every 1000 (B) steps: crashing after 1000
    # gives both runs a checkpoint to resume from and steps to recompute.
    lab_preset="lesson-1.7",
    lab_steps=1200,
    lab_crash_step=1030,
)
SMOKE = Sizes(
    throughput_steps={"quick": 15, "lesson-1.7": 15},
    verify_run={
        "steps": 40,
        "ckpt_every": 10,
        "eval_every": 20,
        "probe_every": 20,
        "sample_every": 40,
        "sample_tokens": 8,
    },
    verify_kills=3,
    nvml_seconds=3.0,
    nvml_interval_s=0.5,
    lab_preset="lesson-1.7-fast",
    lab_steps=240,
    lab_crash_step=60,
)


@dataclass
class Check:
    """What every part gets: where to run, how big, and where to keep files."""

    device: str  # "cuda" or "cpu"
    sizes: Sizes
    work: Path
    deadline: float = 0.0  # time.monotonic() by which the running part must end

    @property
    def on_cuda(self) -> bool:
        return self.device == "cuda"

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class OverBudget(RuntimeError):
    """A part ran out of its time budget before it could finish."""


# ------------------------------------------------------------------ shared helpers


def crashdrill(*args: str) -> list[str]:
    return [sys.executable, "-m", "crashdrill", *args]


def run_bounded(
    argv: list[str], log: Path, timeout: float, env: dict[str, str] | None = None
) -> int | None:
    """Run `argv` with stdout+stderr into `log`; its exit code, or None when it ran past
    `timeout` and was killed with its whole process group (the trainers it started)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            stop_group(proc)
            return None


def stop_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL, wait_s: float = 10) -> None:
    """Signal `proc`'s process group (it was started in its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def preset_file(name: str, check: Check, overrides: dict[str, Any], tag: str) -> Path:
    """Preset `name` as a TOML file in the work dir: run A's config for this device (its
    [run.cuda] applied on CUDA) with `overrides`, pinned to the device. Run A is the one the
    check trains; the knob's setting, when overridden, becomes A's knob value."""
    from crashdrill.trainer.presets import Knob, dump_preset, get_preset

    preset = get_preset(name)
    values = preset.config_for("A", cuda=check.on_cuda).to_dict()
    values.update(overrides, device=check.device)
    knob = preset.knob
    if knob.name in overrides:
        a = overrides[knob.name]
        knob = Knob(knob.name, a, a * 2 if isinstance(a, int) else knob.b)
    values.pop(knob.name)
    changed = dataclasses.replace(
        preset, id=f"gpu-check-{tag}", run=values, cuda={}, a={}, b={}, knob=knob, locked=None
    )
    path = check.work / f"{tag}.toml"
    path.write_text(dump_preset(changed))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    from crashdrill.trainer.records import read_records

    return read_records(path)[0]

"""A trainer forked from the warm process on a CUDA machine: the warm process imported
torch but never initialised CUDA, so the child initialises it after the fork, trains on
the GPU, and resumes bit-identically like an exec'd one. Skipped cleanly without CUDA."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from crashdrill.workers.trainer_process import TrainerProcess
from crashdrill.workers.warm import TRAINER_PRELOAD, WarmTrainers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROBE = """
import json, sys, torch
before = torch.cuda.is_initialized()   # inherited from the warm process: must be False
x = torch.ones(4, device="cuda") * 2
print(json.dumps({"before": before, "after": torch.cuda.is_initialized(),
                  "sum": float(x.sum()), "device": torch.cuda.get_device_name(0)}))
"""


def test_a_forked_child_initialises_cuda_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cudaprobe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    warm = WarmTrainers(preload=TRAINER_PRELOAD, command=["cudaprobe"], enabled=True)
    try:
        with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
            proc = TrainerProcess.start(
                [sys.executable, "-m", "cudaprobe"],
                dict(os.environ),
                stdout=out,
                stderr=err,
                warm=warm,
            )
        assert proc.forked is not None
        assert proc.wait(120) == 0, (tmp_path / "err").read_text()
    finally:
        warm.close()
    seen = json.loads((tmp_path / "out").read_text())
    assert seen["before"] is False and seen["after"] is True and seen["sum"] == 8.0


def test_a_forked_cuda_trainer_resumes_bit_identically(tmp_path: Path) -> None:
    """Uninterrupted vs SIGKILLed after step 70 and restarted, both forked: every step
    both printed has the same loss bits."""
    warm = WarmTrainers(enabled=True)
    run = [sys.executable, "-m", "crashdrill", "run", "quick", "--jsonl", "--quiet"]
    run += ["--set", "device=cuda", "--set", "steps=160"]

    def start(run_dir: Path, out_name: str, *more: str) -> tuple[TrainerProcess, Path]:
        out_path = tmp_path / out_name
        with open(out_path, "ab") as out, open(os.devnull, "wb") as err:
            proc = TrainerProcess.start(
                [*run, "--run-dir", str(run_dir), *more],
                dict(os.environ),
                stdout=out,
                stderr=err,
                warm=warm,
            )
        assert proc.forked is not None, warm.status()
        return proc, out_path

    def bits(path: Path) -> dict[int, int]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return {r["step"]: r["loss_bits"] for r in rows}

    try:
        whole, whole_out = start(tmp_path / "a", "a.out")
        assert whole.wait(300) == 0
        crashed, crashed_out = start(tmp_path / "c", "c1.out")
        deadline = time.monotonic() + 300
        while max(bits(crashed_out), default=0) < 70:
            assert time.monotonic() < deadline, "the crashed run never reached step 70"
            time.sleep(0.05)
        crashed.signal(signal.SIGKILL)
        assert crashed.wait(30) == -signal.SIGKILL
        again, again_out = start(tmp_path / "c", "c2.out", "--require-checkpoint")
        assert again.wait(300) == 0
    finally:
        warm.close()
    reference, resumed = bits(whole_out), bits(again_out)
    assert resumed and min(resumed) <= 70 and max(resumed) == 160
    assert {s: reference[s] for s in resumed} == resumed

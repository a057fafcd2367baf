"""benchmarks/gpu_check.py on a real GPU: the parts that need no server (versions,
throughput, the drill in fp32 and bf16), about six minutes at most; skipped without CUDA.
The full check, lab included, is `python benchmarks/gpu_check.py --out gpu.json`
(docs/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(600),
]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_on_cuda_the_presets_are_measured_and_both_precisions_resume_bit_identical(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "versions,throughput,verify", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=560,
    )
    print(proc.stdout)
    report = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    parts = report["parts"]
    assert parts["versions"]["device_name"] == torch.cuda.get_device_name(0)
    for name, preset in parts["throughput"]["presets"].items():
        assert preset["device_name"] == torch.cuda.get_device_name(0), name
        assert preset["tokens_per_s_median"] > 0, name
    assert parts["throughput"]["presets"]["lesson-1.7"]["precision"] == "bf16"
    for precision in ("fp32", "bf16"):
        drill = parts["verify"]["precisions"][precision]
        assert drill["bit_identical"] and drill["kill_in_checkpoint_write"], drill

"""benchmarks/gpu_check.py end to end on the CPU (`--device cpu --smoke`): every part's
code path runs for real (the trainer, the drill with a kill inside a checkpoint write,
the telemetry sampler, the lab served headless and crash-tested through its API), so the
GPU check cannot rot on machines that have no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_the_cpu_smoke_check_runs_every_part_and_every_resume_is_bit_identical(
    tmp_path: Path,
) -> None:
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert report["status"] == "pass" and report["bit_identical"] is True
    assert list(parts) == ["versions", "throughput", "verify", "nvml", "lab"]
    assert all(p["ok"] and p["seconds"] <= p["budget_s"] for p in parts.values()), parts

    assert parts["versions"]["torch"]
    for preset in ("quick", "lesson-1.7"):
        assert parts["throughput"]["presets"][preset]["tokens_per_s_median"] > 0
    for precision in ("fp32", "bf16"):
        drill = parts["verify"]["precisions"][precision]
        assert drill["verdict"] == "pass" and drill["kill_in_checkpoint_write"], drill
        assert drill["kills_landed"] == 3 and drill["final_state_equal"] is True
    nvml = parts["nvml"]
    assert nvml["samples"] >= 3 and nvml["training_steps_during_sampling"] > 0
    assert set(nvml["fields"]) == set(nvml["supported"]) | set(nvml["unsupported"])
    for label in ("A", "B"):
        run = parts["lab"]["runs"][label]
        assert run["state"] == "finished" and run["bit_identical"] is True, run
        assert run["crash_at_step"] is not None and run["checks"][0]["points"] > 0

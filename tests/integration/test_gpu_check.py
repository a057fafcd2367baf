"""benchmarks/gpu_check.py: how it decides, without running a GPU. The skip path runs the
real script; the verdicts run its pure functions on made-up part results."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script's siblings import by name
    import gpu_check

    return gpu_check


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to skip")
def test_without_cuda_it_exits_0_says_skipped_and_writes_why_in_the_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = _run("--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("skipped: no CUDA device")
    report = json.loads(out.read_text())
    assert report["schema"] == "crashdrill.gpu_check/1"
    assert report["status"] == "skipped" and report["exit_code"] == 0
    assert report["reason"].startswith("no CUDA device") and "parts" not in report


def test_an_unknown_part_is_bad_usage_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = _run("--only", "nvml,warp-drive", "--out", str(out))
    assert proc.returncode == 2
    assert "parts are versions, throughput, verify, nvml, lab" in proc.stderr
    assert not out.exists()


def test_the_budgets_of_all_parts_fit_in_ten_minutes(gpu_check: Any) -> None:
    assert set(gpu_check.BUDGETS_S) == set(gpu_check.PARTS)
    assert sum(gpu_check.BUDGETS_S.values()) <= 600 - 60  # room for the setup and start


def test_one_resume_that_is_not_bit_identical_fails_the_check(gpu_check: Any) -> None:
    good = {"ok": True, "bit_identical": True}
    assert gpu_check.verdict({"verify": good, "lab": good}) == ("pass", True, 0)
    assert gpu_check.verdict({"verify": good, "lab": {"ok": True, "bit_identical": False}}) == (
        "fail",
        False,
        1,
    )


def test_a_failed_part_fails_the_check_even_when_every_resume_matched(gpu_check: Any) -> None:
    parts = {"verify": {"ok": True, "bit_identical": True}, "nvml": {"ok": False}}
    assert gpu_check.verdict(parts) == ("fail", True, 1)
    assert gpu_check.verdict({"nvml": {"ok": True}}) == ("pass", None, 0)


def _drill_report(**changes: Any) -> dict[str, Any]:
    resume = {"index": 1, "killed_at_step": 60, "from_step": 50, "bit_identical": True}
    report = {
        "verdict": "pass",
        "seed": 18,
        "resumes": [resume, {**resume, "index": 2, "kill_in_checkpoint_write": True}],
        "kills": [{"landed": True}, {"landed": True, "in_checkpoint_write": True}],
        "final_state": {"equal": True},
        "diagnosis": [],
    }
    return {**report, **changes}


def test_a_drill_passes_only_with_a_kill_inside_a_checkpoint_write(gpu_check: Any) -> None:
    from gpu_check_runs import summarise_verify

    passed = summarise_verify(_drill_report())
    assert passed["bit_identical"] is True and "error" not in passed
    missed = summarise_verify(_drill_report(kills=[{"landed": True}, {"landed": False}]))
    assert missed["error"] == "no kill landed inside a checkpoint write"


def test_a_drill_that_diverged_is_not_bit_identical_and_says_why(gpu_check: Any) -> None:
    from gpu_check_runs import summarise_verify

    diverged = {"text": "resume 1 diverged at step 51", "fails": True}
    got = summarise_verify(_drill_report(verdict="fail", diagnosis=[diverged]))
    assert got["bit_identical"] is False
    assert got["error"] == "not bit-identical: resume 1 diverged at step 51"


def test_mfu_is_against_the_cards_dense_bf16_peak_whatever_the_runs_precision(
    gpu_check: Any,
) -> None:
    from gpu_check_runs import summarise_throughput

    config = {"n_layer": 6, "d_model": 384, "n_head": 6, "ctx": 256, "batch": 32}
    run = {"kind": "run", "config": config, "vocab": 256, "device_name": "NVIDIA H200"}
    steps = [
        {"kind": "step", "step": s, "tokens_per_s": 8192.0 * 40, "dt": 1 / 40, "mfu": 0.1}
        for s in range(1, 101)
    ]
    got = summarise_throughput([{**run, "precision": "fp32"}, *steps], planned_steps=100)
    assert got["timed_steps"] == 90  # the first tenth is warm-up
    assert got["tokens_per_s_median"] == got["tokens_per_s_mean"] == 8192.0 * 40
    assert got["bf16_peak_flops"] == 989e12
    expected = got["flops_per_token"] * 8192 * 40 / 989e12
    assert got["mfu_bf16_peak"] == round(expected, 5)
    assert (
        summarise_throughput([{**run, "device_name": "cpu"}, *steps], 100)["mfu_bf16_peak"] is None
    )


def _sample(t: float, power: float | None, energy: float | None) -> dict[str, Any]:
    return {"t": t, "power_now_w": power, "energy_j_total": energy, "energy_source": "nvml"}


def test_energy_counter_delta_is_set_against_the_integral_of_power(gpu_check: Any) -> None:
    from gpu_check_live import energy_check

    # 100 W then 300 W one second apart: 200 J by trapezoid; the counter says 210 J.
    got = energy_check([_sample(0.0, 100.0, 0.0), _sample(1.0, 300.0, 210.0)])
    assert got == {
        "source": "nvml",
        "counter_delta_j": 210.0,
        "power_x_time_j": 200.0,
        "ratio": 1.05,
    }
    no_power = energy_check([_sample(0.0, None, 0.0), _sample(1.0, 300.0, 210.0)])
    assert no_power["power_x_time_j"] is None and no_power["ratio"] is None


def test_a_field_nvml_refused_is_unsupported_and_the_others_are_summarised(
    gpu_check: Any,
) -> None:
    from gpu_check_live import gpu_fields, summarise_nvml

    def sample(t: float, util: float) -> dict[str, Any]:
        base = {name: None for name in gpu_fields()}
        return {
            **base,
            **_sample(t, 250.0, t * 250.0),
            "gpu_state": "ok",
            "gpu_reason": None,
            "gpu_name": "NVIDIA H200",
            "gpu_util_pct": util,
            "gpu_unsupported": ["fan_pct"],
        }

    got = summarise_nvml([sample(0.0, 90.0), sample(1.0, 100.0), sample(2.0, 95.0)], {})
    assert got["fields"]["gpu_util_pct"] == {
        "supported": True,
        "min": 90.0,
        "median": 95.0,
        "max": 100.0,
    }
    assert "fan_pct" in got["unsupported"] and got["supported"] == ["gpu_util_pct"]
    assert got["energy"]["ratio"] == 1.0


def test_a_lab_run_whose_crash_recomputed_nothing_proves_nothing(gpu_check: Any) -> None:
    from gpu_check_live import summarise_lab_run

    run = {"state": "finished", "exit_code": 0}
    crash = {"status": 202, "at_step": 1100}
    check = {"segment": 1, "from_step": 1000, "points": 100, "complete": True}
    ok = summarise_lab_run(run, crash, [{**check, "bit_identical": True}])
    assert ok["bit_identical"] is True and "error" not in ok
    empty = summarise_lab_run(run, crash, [{**check, "points": 0, "bit_identical": None}])
    assert empty["error"] == "no resume check recomputed a step"
    differs = summarise_lab_run(run, crash, [{**check, "bit_identical": False}])
    assert differs["error"] == "a resume check is not bit-identical"
    assert summarise_lab_run(run, None, [])["error"].startswith("no Crash test landed")


def test_a_preset_copy_pins_the_device_and_makes_the_knob_run_a_s_value(
    gpu_check: Any, tmp_path: Path
) -> None:
    from gpu_check_common import SMOKE, Check, preset_file

    from crashdrill.trainer.presets import load_preset_file

    check = Check("cpu", SMOKE, tmp_path)
    path = preset_file("quick", check, {"ckpt_every": 10, "precision": "bf16"}, "t")
    cfg = load_preset_file(path).config_for("A")
    assert (cfg.device, cfg.precision, cfg.ckpt_every, cfg.steps) == ("cpu", "bf16", 10, 300)
    cuda = preset_file("lesson-1.7", Check("cuda", SMOKE, tmp_path), {}, "c")
    big = load_preset_file(cuda).config_for("A")  # the [run.cuda] shape, on any machine
    assert (big.n_layer, big.d_model, big.ctx, big.batch, big.precision, big.device) == (
        6,
        384,
        256,
        32,
        "bf16",
        "cuda",
    )


def test_a_part_that_raises_is_recorded_and_the_next_part_still_runs(
    gpu_check: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(check: Any) -> dict[str, Any]:
        raise RuntimeError("no driver")

    monkeypatch.setattr(gpu_check, "part_versions", broken)
    monkeypatch.setattr(gpu_check, "part_nvml", lambda check: {"samples": 3})
    saved: list[list[str]] = []
    check = gpu_check.Check("cpu", gpu_check.SMOKE, tmp_path)
    parts = gpu_check.run_parts(
        check, ["versions", "nvml"], gpu_check.SMOKE_BUDGETS_S, lambda r: saved.append(list(r))
    )
    assert parts["versions"]["ok"] is False
    assert parts["versions"]["error"] == "RuntimeError: no driver"
    assert parts["nvml"]["ok"] is True and parts["nvml"]["samples"] == 3
    assert saved == [["versions"], ["versions", "nvml"]]  # the report is saved after each part


def test_a_command_past_its_timeout_is_killed_with_its_process_group(
    gpu_check: Any, tmp_path: Path
) -> None:
    from gpu_check_common import run_bounded

    pid_file = tmp_path / "child.pid"
    # The shell starts a child that would outlive it; the whole group must go.
    script = f"sleep 30 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    assert run_bounded(["sh", "-c", script], tmp_path / "log", timeout=1.0) is None
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert run_bounded(["sh", "-c", "exit 3"], tmp_path / "log", timeout=10) == 3


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""Parts 1-3 of benchmarks/gpu_check.py: versions, throughput (tokens/s and MFU of the CUDA
presets) and `crashdrill verify` in fp32 and bf16. Run them through gpu_check.py
(`--only versions,throughput,verify`)."""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from gpu_check_common import (
    QUIET_RUN,
    Check,
    crashdrill,
    preset_file,
    read_jsonl,
    run_bounded,
    tail,
)

# ------------------------------------------------------------------ part 1: versions


def part_versions(check: Check) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "crashdrill_commit": _git_commit(),
    }
    if check.on_cuda:
        props = torch.cuda.get_device_properties(0)
        out.update(
            device_name=props.name,
            device_count=torch.cuda.device_count(),
            capability=f"{props.major}.{props.minor}",
            vram_bytes=int(props.total_memory),
            sm_count=int(props.multi_processor_count),
        )
    out.update(_nvml_versions())
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=check.left())
        out["nvidia_smi"] = smi.stdout.splitlines()[:12]
    return out


def _git_commit() -> str | None:
    try:
        got = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return got.stdout.strip() or None


def _nvml_versions() -> dict[str, Any]:
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as exc:
        return {"driver": None, "nvml_reason": f"{type(exc).__name__}: {exc}"}
    try:
        raw = nv.nvmlSystemGetDriverVersion()
        cuda = int(nv.nvmlSystemGetCudaDriverVersion())
        return {
            "driver": raw.decode() if isinstance(raw, bytes) else str(raw),
            "driver_cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    finally:
        nv.nvmlShutdown()


# ------------------------------------------------------------------ part 2: throughput


def part_throughput(check: Check) -> dict[str, Any]:
    from crashdrill.trainer.run_files import RECORDS_FILE

    names = list(check.sizes.throughput_steps)
    out: dict[str, Any] = {"presets": {}}
    for i, name in enumerate(names):
        share = check.left() / (len(names) - i)  # what is left, split over what is left
        steps = check.sizes.throughput_steps[name]
        base = _preset_config(name, check)
        overrides = {**QUIET_RUN, "steps": steps, "warmup": min(base.warmup, steps)}
        overrides["ckpt_policy"] = "end"
        path = preset_file(name, check, overrides, f"throughput-{name}")
        run_dir = check.work / f"throughput-{name}"
        log = check.work / f"throughput-{name}.log"
        code = run_bounded(
            crashdrill("run", str(path), "--run-dir", str(run_dir), "--quiet"), log, share
        )
        result = summarise_throughput(read_jsonl(run_dir / RECORDS_FILE), steps)
        result["exit_code"], result["stopped_by_budget"] = code, code is None
        if code not in (0, None) or not result.get("timed_steps"):
            result["error"] = f"exit {code}, {result.get('timed_steps', 0)} timed steps:\n"
            result["error"] += tail(log)
        out["presets"][name] = result
    out["ok"] = all("error" not in r for r in out["presets"].values())
    return out


def _preset_config(name: str, check: Check) -> Any:
    from crashdrill.trainer.presets import get_preset

    return get_preset(name).config_for("A", cuda=check.on_cuda)


def summarise_throughput(records: list[dict[str, Any]], planned_steps: int) -> dict[str, Any]:
    """Tokens/s and MFU from a run's records. The first tenth of the steps (at least 5) is
    warm-up (allocator, kernels' first launch) and not timed; tokens/s is the median of
    the per-step rates and the timed window's mean."""
    run = next((r for r in records if r.get("kind") == "run"), None)
    steps = [r for r in records if r.get("kind") == "step"]
    warm = max(5, planned_steps // 10)
    timed = [r for r in steps if r["step"] > warm]
    out: dict[str, Any] = {"steps_run": len(steps), "timed_steps": len(timed)}
    if run is not None:
        cfg = run["config"]
        out.update(
            device_name=run.get("device_name"),
            precision=run.get("precision"),
            params=run.get("params"),
            shape=f"{cfg['n_layer']}L·{cfg['d_model']}d·ctx {cfg['ctx']}·batch {cfg['batch']}",
            peak_source=run.get("mfu_peak_source"),
        )
    if not timed or run is None:
        return out
    tokens_per_step = run["config"]["batch"] * run["config"]["ctx"]
    rates = [r["tokens_per_s"] for r in timed]
    out["tokens_per_s_median"] = round(statistics.median(rates), 1)
    out["tokens_per_s_mean"] = round(tokens_per_step * len(timed) / sum(r["dt"] for r in timed), 1)
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    out["mfu_trainer_median"] = round(statistics.median(mfus), 5) if mfus else None
    fpt = flops_per_token(run["config"], run["vocab"])
    out["flops_per_token"] = fpt
    peak = bf16_peak(out.get("device_name") or "")
    out["bf16_peak_flops"] = peak
    out["mfu_bf16_peak"] = round(fpt * out["tokens_per_s_median"] / peak, 5) if peak else None
    return out


def flops_per_token(config: dict[str, Any], vocab: int) -> float:
    """The trainer's own count (GPT.flops_per_token), on a model with no storage."""
    import torch

    from crashdrill.trainer.config import TrainConfig
    from crashdrill.trainer.model import GPT

    with torch.device("meta"):
        model = GPT(TrainConfig.from_dict(config), vocab)
    return float(model.flops_per_token())


def bf16_peak(device_name: str) -> float | None:
    """The card's dense bf16 peak from the trainer's table (None: not a listed GPU)."""
    from crashdrill.trainer.metrics import gpu_peak

    if device_name in ("", "cpu"):
        return None
    return gpu_peak(device_name, "bf16")[0]


# ------------------------------------------------------------------ part 3: verify


def part_verify(check: Check) -> dict[str, Any]:
    out: dict[str, Any] = {"precisions": {}}
    for i, precision in enumerate(("fp32", "bf16")):
        share = check.left() / (2 - i)
        path = preset_file(
            "quick",
            check,
            {**check.sizes.verify_run, "precision": precision},
            f"verify-{precision}",
        )
        report = check.work / f"verify-{precision}.json"
        log = check.work / f"verify-{precision}.log"
        argv = crashdrill("verify", "--preset", str(path), "--kills", str(check.sizes.verify_kills))
        argv += ["--seed", "18", "--json", str(report), "--timeout", str(max(10, int(share)))]
        code = run_bounded(argv, log, share)
        try:
            result = summarise_verify(json.loads(report.read_text()))
        except (OSError, ValueError) as exc:
            result = {"error": f"no report ({exc}); exit {code}:\n{tail(log)}"}
        result["exit_code"] = code
        if code is None:
            result["error"] = f"over its budget ({share:.0f} s):\n{tail(log)}"
        out["precisions"][precision] = result
    results = out["precisions"].values()
    out["bit_identical"] = all(r.get("bit_identical") is True for r in results)
    out["ok"] = all("error" not in r for r in results)
    return out


def summarise_verify(report: dict[str, Any]) -> dict[str, Any]:
    """The drill's JSON report reduced to what this check asserts: every resume
    bit-identical, the final weights equal, and one kill inside a checkpoint write."""
    resumes = [
        {
            k: r.get(k)
            for k in (
                "index",
                "killed_at_step",
                "from_step",
                "kill_in_checkpoint_write",
                "points",
                "max_abs_delta",
                "bit_identical",
                "verdict",
            )
        }
        for r in report.get("resumes", [])
    ]
    final = report.get("final_state") or {}
    in_write = any(k.get("in_checkpoint_write") for k in report.get("kills", []))
    out: dict[str, Any] = {
        "verdict": report.get("verdict"),
        "seed": report.get("seed"),
        "resumes": resumes,
        "kills_landed": sum(1 for k in report.get("kills", []) if k.get("landed")),
        "kill_in_checkpoint_write": in_write,
        "final_state_equal": final.get("equal"),
        "wall_seconds": report.get("wall_seconds"),
        "diagnosis": [d.get("text") for d in report.get("diagnosis", []) if d.get("fails")],
    }
    out["bit_identical"] = (
        report.get("verdict") == "pass"
        and bool(resumes)
        and all(r["bit_identical"] for r in resumes)
    )
    if not in_write:
        out["error"] = "no kill landed inside a checkpoint write"
    elif not out["bit_identical"]:
        out["error"] = "not bit-identical: " + "; ".join(out["diagnosis"] or ["see resumes"])
    return out

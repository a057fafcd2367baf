"""The two parts of benchmarks/gpu_check.py that watch something live: NVML sampled while a
run trains (part 4), and the lab served headless with a pair crash-tested through its API
(part 5). Run them through gpu_check.py (`--only nvml`, `--only lab`)."""

from __future__ import annotations

import itertools
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from gpu_check_common import QUIET_RUN, Check, OverBudget, crashdrill, preset_file, stop_group, tail

# ------------------------------------------------------------------ part 4: nvml


def part_nvml(check: Check) -> dict[str, Any]:
    """Every GPU field the machine panel shows, sampled while lesson 1.7 trains."""
    from crashdrill.workers.telemetry import TelemetrySampler

    seconds, every = check.sizes.nvml_seconds, check.sizes.nvml_interval_s
    load = {**QUIET_RUN, "steps": 10**7, "ckpt_policy": "end"}
    path = preset_file("lesson-1.7", check, load, "nvml-load")
    run_dir, log = check.work / "nvml-load", check.work / "nvml-load.log"
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            crashdrill("run", str(path), "--run-dir", str(run_dir), "--quiet"),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sampler = TelemetrySampler()
    try:
        _wait_for_step(run_dir, proc, log, check.left() - seconds - 5)
        samples, t_end = [], time.monotonic() + seconds
        while time.monotonic() < t_end:
            samples.append(sampler.sample())
            time.sleep(max(0.0, min(every, t_end - time.monotonic())))
        samples.append(sampler.sample())
        reasons = sampler.gpu.unsupported_reasons
    finally:
        sampler.close()
        stop_group(proc)
    out = summarise_nvml([s.to_record() for s in samples], reasons)
    out["training_steps_during_sampling"] = _steps_between(run_dir, samples[0].t, samples[-1].t)
    if check.on_cuda and out["gpu_state"] != "ok":
        out["error"] = f"NVML gave no GPU reading: {out['gpu_reason']}"
    return out


def _wait_for_step(run_dir: Path, proc: subprocess.Popen[Any], log: Path, timeout: float) -> None:
    from crashdrill.trainer.run_files import RECORDS_FILE, read_records

    deadline = time.monotonic() + timeout
    while not any(r.get("kind") == "step" for r in read_records(run_dir / RECORDS_FILE)[0]):
        if proc.poll() is not None:
            raise RuntimeError(f"the training load exited {proc.returncode}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise OverBudget(f"the training load trained no step in {timeout:.0f} s")
        time.sleep(0.2)


def _steps_between(run_dir: Path, t0: float, t1: float) -> int:
    from crashdrill.trainer.run_files import RECORDS_FILE, read_records

    steps = read_records(run_dir / RECORDS_FILE)[0]
    return sum(1 for r in steps if r.get("kind") == "step" and t0 <= r["t"] <= t1)


def gpu_fields() -> tuple[str, ...]:
    """The sample's GPU fields: NVML's reading less the raw energy counter (the sampler
    turns it into energy_j_total)."""
    from crashdrill.workers.nvml import GPU_READING_FIELDS

    return tuple(f for f in GPU_READING_FIELDS if f != "energy_counter_mj")


def summarise_nvml(samples: list[dict[str, Any]], reasons: dict[str, str]) -> dict[str, Any]:
    """Per GPU field: supported or not, and min / median / max of its values; the energy
    counter's delta over the window against the trapezoid integral of power over time."""
    last = samples[-1]
    fields: dict[str, Any] = {}
    for name in gpu_fields():
        values = [s[name] for s in samples if s.get(name) is not None]
        fields[name] = {
            "supported": bool(values) and name not in last["gpu_unsupported"],
            "min": min(values) if values else None,
            "median": statistics.median(values) if values else None,
            "max": max(values) if values else None,
        }
    out: dict[str, Any] = {
        "gpu_state": last["gpu_state"],
        "gpu_reason": last["gpu_reason"],
        "gpu_name": last["gpu_name"],
        "samples": len(samples),
        "window_s": round(last["t"] - samples[0]["t"], 2),
        "fields": fields,
        "supported": [n for n, f in fields.items() if f["supported"]],
        "unsupported": [n for n, f in fields.items() if not f["supported"]],
        "unsupported_reasons": reasons,
        "energy": energy_check(samples),
    }
    return out


def energy_check(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The energy counter's joules over the window against ∫ power dt (trapezoids over the
    samples' power readings): two views of one quantity, so their ratio should be near 1."""
    first, last = samples[0], samples[-1]
    counter = None
    if first.get("energy_j_total") is not None and last.get("energy_j_total") is not None:
        counter = last["energy_j_total"] - first["energy_j_total"]
    integral: float | None = 0.0
    for a, b in itertools.pairwise(samples):
        if a.get("power_now_w") is None or b.get("power_now_w") is None:
            integral = None
            break
        assert integral is not None
        integral += (a["power_now_w"] + b["power_now_w"]) / 2 * (b["t"] - a["t"])
    if len(samples) < 2:
        integral = None
    ratio = counter / integral if counter is not None and integral else None
    return {
        "source": last.get("energy_source"),
        "counter_delta_j": None if counter is None else round(counter, 2),
        "power_x_time_j": None if integral is None else round(integral, 2),
        "ratio": None if ratio is None else round(ratio, 4),
    }


# ------------------------------------------------------------------ part 5: the lab


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def part_lab(check: Check) -> dict[str, Any]:
    """`crashdrill serve` on a free loopback port; one pair, one Crash test per run."""
    import httpx

    sizes = check.sizes
    port, log = free_port(), check.work / "lab.log"
    argv = crashdrill("serve", "--port", str(port), "--data-dir", str(check.work / "lab"))
    argv += ["--stop-runs-on-exit", "--max-concurrent", "2", "--log-level", "warning"]
    with open(log, "ab") as out:
        server = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for_server(url, server, log, min(60.0, check.left()))
        with httpx.Client(base_url=url, timeout=30) as client:
            return _crash_test_pair(client, check, sizes.lab_preset, sizes.lab_steps)
    finally:
        stop_group(server, signal.SIGTERM, wait_s=20)  # the lab stops its runs on exit


def _wait_for_server(url: str, server: subprocess.Popen[Any], log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/api/presets", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            if server.poll() is not None:
                raise RuntimeError(
                    f"crashdrill serve exited {server.returncode}:\n{tail(log)}"
                ) from None
            if time.monotonic() > deadline:
                raise OverBudget(f"crashdrill serve did not answer in {timeout:.0f} s") from None
            time.sleep(0.2)


def _crash_test_pair(client: Any, check: Check, preset: str, steps: int) -> dict[str, Any]:
    r = client.post("/api/pairs", json={"preset": preset, "overrides": {"steps": steps}})
    if r.status_code != 201:
        raise RuntimeError(f"POST /api/pairs answered {r.status_code}: {r.text}")
    body = r.json()
    pair, ids = body["pair"], [run["id"] for run in body["runs"]]
    crashes: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    while True:
        runs = client.get(f"/api/pairs/{pair}").json()["runs"]
        for run in runs:
            due = run["segment"] == 0 and (run["step"] or 0) >= check.sizes.lab_crash_step
            if run["label"] not in crashes and run["can_crash"] and due:
                got = client.post(f"/api/runs/{run['id']}/crash")
                crashes[run["label"]] = {"status": got.status_code, **got.json()}
        if all(run["state"] in ("finished", "failed", "stopped") for run in runs):
            break
        if check.left() <= 0:
            states = [(r["label"], r["state"], r["segment"], r["step"]) for r in runs]
            raise OverBudget(f"the pair did not finish within the budget: {states}")
        time.sleep(0.1)
    out: dict[str, Any] = {"preset": preset, "steps": steps, "pair": pair, "runs": {}}
    for run_id, run in zip(ids, runs, strict=True):
        checks = client.get(f"/api/runs/{run_id}/resume-checks").json()["checks"]
        recs = client.get(f"/api/runs/{run_id}/records", params={"kind": "run", "limit": 1})
        first = (recs.json()["records"] or [{}])[0]
        out["runs"][run["label"]] = summarise_lab_run(run, crashes.get(run["label"]), checks)
        out["runs"][run["label"]]["device_name"] = first.get("device_name")
        out["runs"][run["label"]]["precision"] = first.get("precision")
    for label, result in out["runs"].items():
        print(
            f"lab run {label}: {result['state']}, crash at {result['crash_at_step']}, "
            f"resume checks {result['checks']}",
            flush=True,
        )
    out["bit_identical"] = all(r["bit_identical"] for r in out["runs"].values())
    # How the lab started its CUDA trainers: forked from the warm process (which never
    # touches CUDA; each child initialises it after the fork), or exec'd, and why.
    out["trainers"] = client.get("/api/health").json().get("trainers")
    print(f"lab trainers: {out['trainers']}", flush=True)
    problems = [f"{k}: {r['error']}" for k, r in out["runs"].items() if r.get("error")]
    if problems:
        out["error"] = "; ".join(problems)
    return out


def summarise_lab_run(
    run: dict[str, Any], crash: dict[str, Any] | None, checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """One run of the pair: its end, the Crash test, and the lab's resume checks. Bit-
    identical means at least one check recomputed steps and every such check matched."""
    compared = [c for c in checks if c.get("points")]
    out: dict[str, Any] = {
        "state": run["state"],
        "exit_code": run.get("exit_code"),
        "crash_at_step": (crash or {}).get("at_step"),
        "checks": [
            {
                k: c.get(k)
                for k in (
                    "segment",
                    "from_step",
                    "steps",
                    "points",
                    "expected_points",
                    "complete",
                    "max_abs_delta",
                    "bit_identical",
                )
            }
            for c in checks
        ],
        "bit_identical": bool(compared)
        and all(c.get("bit_identical") is True and c.get("complete") for c in compared),
    }
    if crash is None or crash.get("status") != 202:
        out["error"] = f"no Crash test landed ({crash})"
    elif run["state"] != "finished":
        out["error"] = f"the run ended {run['state']} (exit {run.get('exit_code')})"
    elif not compared:
        out["error"] = "no resume check recomputed a step"
    elif not out["bit_identical"]:
        out["error"] = "a resume check is not bit-identical"
    return out

"""Throughput, MFU and memory. MFU divides achieved FLOP/s by a stated peak: a table for
known GPUs, and on CPU a matmul peak measured once on this machine and cached."""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import time

import torch

from crashdrill.trainer.data import cache_dir

# Dense peak TFLOP/s per precision (vendor datasheets, without sparsity).
GPU_PEAKS_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp32": 19.5},
    "A10G": {"bf16": 70.0, "fp32": 31.2},
    "L40S": {"bf16": 362.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp32": 30.3},
    "T4": {"bf16": 65.0, "fp32": 8.1},  # T4 has no bf16; its fp16 tensor-core peak
    "V100": {"bf16": 125.0, "fp32": 15.7},
    "RTX 4090": {"bf16": 165.0, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp32": 35.6},
}


def gpu_peak(device_name: str, precision: str) -> tuple[float | None, str]:
    for key, peaks in GPU_PEAKS_TFLOPS.items():
        if key.lower() in device_name.lower():
            return peaks[
                precision
            ] * 1e12, f"{key} datasheet {precision} {peaks[precision]} TFLOP/s"
    return None, f"{device_name}: not in the peak table, MFU not computed"


@functools.cache
def cpu_name() -> str:
    """The CPU's name as the peak's cache keys it. platform.processor() runs `uname -p` in
    a subprocess (8 ms) the first time in a process: a warm process calls this once
    (trainer/warm_caches.py), so a trainer forked from it starts without the subprocess."""
    return platform.processor() or platform.machine()


def cpu_peak(threads: int) -> tuple[float, str]:
    """FLOP/s that `threads` cores of this CPU can do: one core's fp32 matmul rate, measured
    once and cached per (cpu, torch version), times `threads`.

    One core, over its own CPU time (not the wall clock), best of several bursts: the peak
    is measured when a trainer starts, which in the lab is while the pair's other run
    trains, and a wall-clock measurement on a busy machine came out at a third of the
    truth (MFU over 100 % for the rest of the run, and for every later run that read the
    cache)."""
    key = f"{cpu_name()}-{os.cpu_count()}-core-{torch.__version__}"
    path = cache_dir() / "cpu_peak.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        cached[key] = _one_core_flops()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cached))
        os.replace(tmp, path)
    core = float(cached[key])
    peak = core * max(1, threads)
    return (
        peak,
        f"measured fp32 matmul peak of one core on this CPU ({core / 1e9:.1f} GFLOP/s)"
        f" × {threads} thread(s): {peak / 1e9:.1f} GFLOP/s",
    )


def _one_core_flops(n: int = 256, bursts: int = 5, burst_cpu_s: float = 0.04) -> float:
    """A 256×256 fp32 matmul's rate on one thread, per second of this process's CPU time,
    the best of `bursts` (time another process takes from the core is not counted)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
        b = torch.ones(n, n)
        torch.mm(a, b)
        best = 0.0
        for _ in range(bursts):
            reps, t0 = 0, time.process_time()
            while (spent := time.process_time() - t0) < burst_cpu_s:
                torch.mm(a, b)
                reps += 1
            best = max(best, 2 * n**3 * reps / spent)
        return best
    finally:
        torch.set_num_threads(before)


def memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_peak_allocated"
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), "rss"
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss"

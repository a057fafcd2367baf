"""Telemetry on a real NVIDIA GPU: every field read through NVML, and which ones this
board supports printed for the record.

    .venv/bin/python -m pytest tests/gpu/test_nvml.py -s
"""

from __future__ import annotations

import time

import pytest

from crashdrill.workers.nvml import GPU_READING_FIELDS, open_gpu
from crashdrill.workers.telemetry import TelemetrySample, TelemetrySampler
from tests.support.extras import require_extra

pytestmark = pytest.mark.gpu

# The sample's GPU fields: the reading's fields less the raw energy counter, which the
# sampler turns into energy_j_total.
SAMPLE_GPU_FIELDS = tuple(f for f in GPU_READING_FIELDS if f != "energy_counter_mj")


@pytest.fixture(scope="module")
def real_gpu() -> None:
    require_extra("gpu")
    gpu = open_gpu(0)
    try:
        if gpu.state != "ok":
            pytest.skip(f"no usable NVIDIA GPU: {gpu.reason}")
    finally:
        gpu.close()


def print_support(sample: TelemetrySample, reasons: dict[str, str]) -> None:
    print(f"\n{sample.gpu_name}: {len(sample.gpu_unsupported)} GPU fields unsupported")
    for name in SAMPLE_GPU_FIELDS:
        value = getattr(sample, name)
        print(f"  {name:<18} {'unsupported' if value is None else value}")
    for query, reason in reasons.items():
        print(f"  NVML {query}: {reason}")
    print(f"  energy_source={sample.energy_source} energy_j_total={sample.energy_j_total}")


def test_real_gpu_reads_every_supported_field(real_gpu: None) -> None:
    sampler = TelemetrySampler(price_per_kwh=0.15, rent_per_hour=1.0)
    try:
        sampler.sample()
        time.sleep(1.0)  # one interval so that energy and rates have a delta
        sample = sampler.sample()
        print_support(sample, sampler.gpu.unsupported_reasons)
    finally:
        sampler.close()

    assert sample.gpu_state == "ok" and sample.gpu_reason is None and sample.gpu_name
    # A field is None exactly when NVML refused it: nothing is lost silently.
    for name in SAMPLE_GPU_FIELDS:
        assert (getattr(sample, name) is None) == (name in sample.gpu_unsupported), name
    # Every NVML-capable board reports memory.
    assert sample.vram_total_bytes is not None and sample.vram_total_bytes > 0
    assert sample.vram_used_bytes is not None
    assert 0 <= sample.vram_used_bytes <= sample.vram_total_bytes
    for pct in (sample.gpu_util_pct, sample.mem_bus_util_pct, sample.fan_pct):
        assert pct is None or 0.0 <= pct <= 100.0
    assert sample.temp_c is None or 0.0 < sample.temp_c < 120.0
    assert sample.power_now_w is None or sample.power_now_w > 0.0  # idle boards draw too
    if sample.energy_source == "nvml":
        assert sample.energy_j_total is not None and sample.energy_j_total > 0.0
        assert sample.cost_power_usd is not None and sample.cost_power_usd > 0.0

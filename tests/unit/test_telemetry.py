"""Machine telemetry sampler: host counters from real psutil, NVML through a fake
`pynvml` module, RAPL through a fake powercap tree.

    .venv/bin/python -m pytest tests/unit/test_telemetry.py -q
"""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import pytest

from crashdrill.workers.telemetry import RaplMeter, TelemetrySample, TelemetrySampler

GIB = 1024**3
GPU_FIELDS = (
    "gpu_util_pct",
    "vram_used_bytes",
    "vram_total_bytes",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "mem_bus_util_pct",
    "fan_pct",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
)
NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, RM_MISMATCH = 3, 4, 9, 12, 18


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


class FakeNotSupported(FakeNVMLError):
    def __init__(self) -> None:
        super().__init__(NOT_SUPPORTED)


class FakeNoPermission(FakeNVMLError):
    def __init__(self) -> None:
        super().__init__(NO_PERMISSION)


class FakeNvml:
    """A stand-in for `pynvml`: one H200-like board whose fan and PCIe RX are not
    supported and whose power limit needs permissions we lack."""

    def __init__(
        self,
        energy_mj: list[float] | None = None,
        refuse: frozenset[str] = frozenset({"fan", "pcie_rx", "power_limit"}),
        init_error: int | None = None,
        device_count: int = 1,
    ) -> None:
        self.calls: Counter[str] = Counter()
        self.energy_mj = list(energy_mj or [1_000_000.0])
        self.refuse = refuse
        self.init_error = init_error
        self.device_count = device_count

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.refuse:
            raise FakeNoPermission() if name == "power_limit" else FakeNotSupported()

    def module(self) -> ModuleType:
        nv = ModuleType("pynvml")
        attrs: dict[str, Any] = {
            "NVMLError": FakeNVMLError,
            "NVMLError_NotSupported": FakeNotSupported,
            "NVML_ERROR_LIBRARY_NOT_FOUND": LIBRARY_NOT_FOUND,
            "NVML_ERROR_DRIVER_NOT_LOADED": DRIVER_NOT_LOADED,
            "NVML_TEMPERATURE_GPU": 0,
            "NVML_CLOCK_SM": 1,
            "NVML_PCIE_UTIL_TX_BYTES": 0,
            "NVML_PCIE_UTIL_RX_BYTES": 1,
            "nvmlInit": self.init,
            "nvmlShutdown": lambda: self.calls.update(["shutdown"]),
            "nvmlDeviceGetCount": lambda: self.device_count,
            "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
            "nvmlDeviceGetName": lambda h: b"NVIDIA H200",
            "nvmlDeviceGetUtilizationRates": self.utilization,
            "nvmlDeviceGetMemoryInfo": self.memory,
            "nvmlDeviceGetPowerUsage": self.power,
            "nvmlDeviceGetEnforcedPowerLimit": self.power_limit,
            "nvmlDeviceGetTemperature": self.temperature,
            "nvmlDeviceGetClockInfo": self.clock,
            "nvmlDeviceGetFanSpeed": self.fan,
            "nvmlDeviceGetPcieThroughput": self.pcie,
            "nvmlDeviceGetTotalEnergyConsumption": self.energy,
        }
        for name, value in attrs.items():
            setattr(nv, name, value)
        return nv

    def init(self) -> None:
        self.calls["init"] += 1
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def utilization(self, handle: object) -> SimpleNamespace:
        self._call("utilization")
        return SimpleNamespace(gpu=87, memory=41)

    def memory(self, handle: object) -> SimpleNamespace:
        self._call("memory")
        return SimpleNamespace(used=10 * GIB, total=141 * GIB, free=131 * GIB)

    def power(self, handle: object) -> int:
        self._call("power")
        return 250_000  # mW

    def power_limit(self, handle: object) -> int:
        self._call("power_limit")
        return 700_000

    def temperature(self, handle: object, sensor: int) -> int:
        self._call("temperature")
        assert sensor == 0, "asked for a sensor other than the GPU die"
        return 63

    def clock(self, handle: object, clock_type: int) -> int:
        self._call("sm_clock")
        assert clock_type == 1, "asked for a clock other than SM"
        return 1980

    def fan(self, handle: object) -> int:
        self._call("fan")
        return 55

    def pcie(self, handle: object, counter: int) -> int:
        self._call("pcie_tx" if counter == 0 else "pcie_rx")
        return 2048  # KB/s

    def energy(self, handle: object) -> float:
        self._call("energy")
        # Each sample consumes the next counter value; the last one repeats.
        return self.energy_mj.pop(0) if len(self.energy_mj) > 1 else self.energy_mj[0]


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


# --- host counters (real psutil) -------------------------------------------------------


def test_two_real_samples_give_sane_host_rates(no_nvml: None) -> None:
    sampler = TelemetrySampler()
    first = sampler.sample()
    time.sleep(0.2)
    second = sampler.sample()

    assert first.cpu_pct is None and first.disk_read_bytes_s is None
    assert first.net_in_bytes_s is None
    assert second.cpu_pct is not None and 0.0 <= second.cpu_pct <= 100.0
    for rate in (
        second.disk_read_bytes_s,
        second.disk_write_bytes_s,
        second.net_in_bytes_s,
        second.net_out_bytes_s,
    ):
        assert rate is None or rate >= 0.0
    assert second.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < second.ram_used_bytes <= second.ram_total_bytes
    assert second.t >= first.t > 1.6e9


def test_record_is_versioned_json_with_every_field(no_nvml: None) -> None:
    sampler = TelemetrySampler()
    sampler.sample()
    record = sampler.sample().to_record()

    round_tripped = json.loads(json.dumps(record, allow_nan=False))
    assert round_tripped == record
    assert record["v"] == 1 and record["kind"] == "telemetry"
    assert set(record) == {"v", "kind"} | {f.name for f in fields(TelemetrySample)}


def test_counter_reset_counts_zero_and_missing_disks_give_none(
    no_nvml: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_reads = iter([5_000_000, 1_000])  # a device re-attached between samples
    net = iter([(100, 1_000_000), (300, 1_000_000 + 10**9)])
    monkeypatch.setattr(
        psutil,
        "disk_io_counters",
        lambda: SimpleNamespace(read_bytes=next(disk_reads), write_bytes=0),
    )

    def nics(pernic: bool) -> dict[str, SimpleNamespace]:
        eth_in, lo_in = next(net)
        return {
            "eth0": SimpleNamespace(bytes_recv=eth_in, bytes_sent=0),
            "lo": SimpleNamespace(bytes_recv=lo_in, bytes_sent=lo_in),
        }

    monkeypatch.setattr(psutil, "net_io_counters", nics)
    clock = FakeClock()
    sampler = TelemetrySampler(monotonic=clock)
    sampler.sample()
    clock.now += 2.0
    sample = sampler.sample()
    assert sample.disk_read_bytes_s == 0.0
    assert sample.net_in_bytes_s == 100.0  # (300 - 100) / 2 s; loopback left out

    monkeypatch.setattr(psutil, "disk_io_counters", lambda: None)
    clock.now += 2.0
    assert sampler.sample().disk_read_bytes_s is None


def test_bad_prices_are_refused_with_the_field_name(no_nvml: None) -> None:
    with pytest.raises(ValueError, match="price_per_kwh"):
        TelemetrySampler(price_per_kwh=-0.1)
    with pytest.raises(ValueError, match="rent_per_hour"):
        TelemetrySampler(rent_per_hour=math.nan)
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler().start(lambda s: None, interval_s=0)


# --- NVML through a fake pynvml --------------------------------------------------------


def test_nvml_fields_are_mapped_to_units(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNvml())
    sample = TelemetrySampler().sample()

    assert (sample.gpu_state, sample.gpu_reason, sample.gpu_name) == ("ok", None, "NVIDIA H200")
    assert sample.gpu_util_pct == 87.0 and sample.mem_bus_util_pct == 41.0
    assert sample.vram_used_bytes == 10 * GIB and sample.vram_total_bytes == 141 * GIB
    assert sample.power_w == 250.0 and sample.power_now_w == 250.0
    assert sample.temp_c == 63.0 and sample.sm_clock_mhz == 1980.0
    assert sample.pcie_tx_bytes_s == 2048 * 1024
    assert sample.energy_source == "nvml"


def test_unsupported_fields_are_none_and_asked_only_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeNvml())
    sampler = TelemetrySampler()
    samples = [sampler.sample() for _ in range(4)]

    for sample in samples:
        assert sample.fan_pct is None and sample.pcie_rx_bytes_s is None
        assert sample.power_limit_w is None  # NoPermission is remembered too
        assert sample.gpu_unsupported == ("power_limit_w", "fan_pct", "pcie_rx_bytes_s")
    assert fake.calls["fan"] == fake.calls["pcie_rx"] == fake.calls["power_limit"] == 1
    assert fake.calls["pcie_tx"] == fake.calls["utilization"] == fake.calls["power"] == 4
    assert set(sampler.gpu.unsupported_reasons) == {"fan", "pcie_rx", "power_limit"}


def test_energy_counter_deltas_become_kwh_and_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    counter_mj = [1_000_000.0, 4_600_000.0, 6_400_000.0, 500.0, 3_600_500.0]
    install(monkeypatch, FakeNvml(energy_mj=counter_mj))
    clock = FakeClock()
    sampler = TelemetrySampler(price_per_kwh=0.20, rent_per_hour=3.0, monotonic=clock)

    totals_j = []
    for _ in counter_mj:
        sample = sampler.sample()
        totals_j.append(sample.energy_j_total)
        clock.now += 900.0

    # +3600 J, +1800 J, driver reload (counter back to 500 mJ) counts 0, +3600 J.
    assert totals_j == [0.0, 3600.0, 5400.0, 5400.0, 9000.0]
    assert sample.energy_kwh_total == pytest.approx(9000 / 3.6e6)
    assert sample.cost_power_usd == pytest.approx(0.0025 * 0.20)
    assert sample.cost_rent_usd == pytest.approx(3.0 * 1.0)  # 4 × 900 s = 1 h


def test_power_comes_from_energy_when_power_reading_unsupported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(monkeypatch, FakeNvml(energy_mj=[0.0, 600_000.0], refuse=frozenset({"power"})))
    clock = FakeClock()
    sampler = TelemetrySampler(monotonic=clock)
    assert sampler.sample().power_now_w is None
    clock.now += 2.0
    sample = sampler.sample()
    assert sample.power_w is None
    assert sample.power_now_w == pytest.approx(300.0)  # 600 J over 2 s


def test_no_pynvml_means_no_gpu_state_and_null_gpu_fields(no_nvml: None) -> None:
    sample = TelemetrySampler().sample()
    assert sample.gpu_state == "no_gpu"
    assert sample.gpu_reason is not None and "pynvml" in sample.gpu_reason
    for name in GPU_FIELDS:
        assert getattr(sample, name) is None, name
    assert sample.gpu_name is None and sample.gpu_unsupported == ()


@pytest.mark.parametrize(
    ("code", "state"),
    [(LIBRARY_NOT_FOUND, "no_gpu"), (DRIVER_NOT_LOADED, "no_gpu"), (RM_MISMATCH, "nvml_error")],
)
def test_nvml_init_failure_sets_state_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, code: int, state: str
) -> None:
    install(monkeypatch, FakeNvml(init_error=code))
    sample = TelemetrySampler().sample()
    assert sample.gpu_state == state
    assert sample.gpu_reason is not None and str(code) in sample.gpu_reason
    assert sample.gpu_util_pct is None


def test_gpu_index_past_the_last_gpu_is_an_nvml_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeNvml(device_count=1))
    sample = TelemetrySampler(gpu_index=1).sample()
    assert sample.gpu_state == "nvml_error"
    assert sample.gpu_reason is not None and "gpu_index=1" in sample.gpu_reason
    assert fake.calls["shutdown"] == 1 and fake.calls["utilization"] == 0


def test_close_releases_nvml_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeNvml())
    sampler = TelemetrySampler()
    sampler.sample()
    sampler.close()
    sampler.close()
    assert fake.calls["shutdown"] == 1


# --- RAPL through a fake powercap tree -------------------------------------------------


def write_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = 10**9) -> None:
    (root / zone).mkdir(parents=True, exist_ok=True)
    (root / zone / "name").write_text(name + "\n")
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")
    (root / zone / "max_energy_range_uj").write_text(f"{max_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Iterator[Path]:
    write_zone(tmp_path, "intel-rapl:0", "package-0", 100_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", "core", 5_000)  # inside package 0
    write_zone(tmp_path, "intel-rapl:0:1", "uncore", 5_000)
    (tmp_path / "intel-rapl:0:1" / "name").unlink()  # a subzone whose name is unreadable
    write_zone(tmp_path, "intel-rapl:1", "psys", 7_000)  # whole platform
    write_zone(tmp_path, "intel-rapl:2", "package-1", 1_000)
    yield tmp_path


def test_rapl_sums_packages_only(powercap: Path) -> None:
    meter = RaplMeter(powercap)
    assert meter.delta_j() is None  # baseline
    write_zone(powercap, "intel-rapl:0", "package-0", 102_000_000)
    write_zone(powercap, "intel-rapl:0:0", "core", 900_000_000)
    (powercap / "intel-rapl:0:1" / "energy_uj").write_text("900000000\n")
    write_zone(powercap, "intel-rapl:1", "psys", 900_000_000)
    write_zone(powercap, "intel-rapl:2", "package-1", 501_000)
    assert meter.delta_j() == pytest.approx(2.5)


def test_rapl_wraparound_uses_max_energy_range(powercap: Path) -> None:
    write_zone(powercap, "intel-rapl:0", "package-0", 10**9 - 1_000_000)
    meter = RaplMeter(powercap)
    meter.delta_j()
    write_zone(powercap, "intel-rapl:0", "package-0", 3_000_000)
    assert meter.delta_j() == pytest.approx(4.0)


def test_unreadable_rapl_is_none_and_not_read_again(powercap: Path) -> None:
    meter = RaplMeter(powercap)
    energy = powercap / "intel-rapl:0" / "energy_uj"
    energy.unlink()
    energy.mkdir()  # reading a directory fails like a root-only file does for a user
    assert meter.delta_j() is None and not meter.available
    energy.rmdir()
    energy.write_text("1\n")
    meter.delta_j()
    assert meter.delta_j() is None and meter.unreadable_reason is not None


def test_cpu_only_machine_gets_rapl_power_energy_and_cost(no_nvml: None, powercap: Path) -> None:
    clock = FakeClock()
    sampler = TelemetrySampler(price_per_kwh=0.30, powercap_root=powercap, monotonic=clock)
    first = sampler.sample()
    assert first.energy_source == "rapl" and first.energy_j_total == 0.0
    write_zone(powercap, "intel-rapl:0", "package-0", 100_000_000 + 36_000_000)
    clock.now += 2.0
    sample = sampler.sample()
    assert sample.power_now_w == pytest.approx(18.0)  # 36 J over 2 s
    assert sample.energy_kwh_total == pytest.approx(1e-5)
    assert sample.cost_power_usd == pytest.approx(3e-6)


def test_no_energy_source_leaves_energy_and_power_cost_null(no_nvml: None, tmp_path: Path) -> None:
    clock = FakeClock()
    sampler = TelemetrySampler(rent_per_hour=1.2, powercap_root=tmp_path, monotonic=clock)
    sampler.sample()
    clock.now += 1800.0
    sample = sampler.sample()
    assert sample.energy_source is None and sample.energy_j_total is None
    assert sample.power_now_w is None and sample.cost_power_usd is None
    assert sample.cost_rent_usd == pytest.approx(0.6)


# --- background thread -----------------------------------------------------------------


def test_background_thread_delivers_samples_and_stops_within_a_second(no_nvml: None) -> None:
    delivered: queue.Queue[TelemetrySample] = queue.Queue()
    sampler = TelemetrySampler()
    sampler.start(delivered.put, interval_s=0.05)
    samples = [delivered.get(timeout=5.0) for _ in range(3)]
    assert samples[0].t < samples[1].t < samples[2].t
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start(delivered.put)

    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 1.0
    assert not any(t.name == "telemetry-sampler" for t in threading.enumerate())


def test_stop_does_not_wait_out_a_long_interval(no_nvml: None) -> None:
    delivered: queue.Queue[TelemetrySample] = queue.Queue()
    sampler = TelemetrySampler()
    sampler.start(delivered.put, interval_s=30.0)
    delivered.get(timeout=5.0)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 1.0
    assert delivered.empty()


def test_failing_callback_does_not_stop_the_sampler(no_nvml: None) -> None:
    calls: queue.Queue[int] = queue.Queue()
    seen = Counter[str]()

    def flaky(sample: TelemetrySample) -> None:
        seen["calls"] += 1
        calls.put(seen["calls"])
        if seen["calls"] == 1:
            raise OSError("disk full")

    sampler = TelemetrySampler()
    sampler.start(flaky, interval_s=0.02)
    assert [calls.get(timeout=5.0) for _ in range(3)] == [1, 2, 3]
    sampler.stop()


def test_run_returns_when_its_stop_event_is_set(no_nvml: None) -> None:
    stop = threading.Event()
    got: list[TelemetrySample] = []

    def collect(sample: TelemetrySample) -> None:
        got.append(sample)
        if len(got) == 2:
            stop.set()

    TelemetrySampler().run(collect, interval_s=0.01, stop_event=stop)
    assert len(got) == 2


# --- one process each (a run's ranks) ----------------------------------------------------


def test_a_rank_process_s_gpu_memory_comes_from_nvml_s_process_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashdrill.workers.telemetry import ProcessSampler

    me = os.getpid()
    fake = FakeNvml()
    nv = fake.module()
    listed = [
        SimpleNamespace(pid=me, usedGpuMemory=3 * GIB),
        SimpleNamespace(pid=1, usedGpuMemory=None),
    ]
    nv.nvmlDeviceGetComputeRunningProcesses = lambda handle: listed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = ProcessSampler(min_interval_s=0.0)
    reading = sampler.read([me])[me]
    assert reading.gpu_mem_bytes == 3 * GIB and reading.rss_bytes
    sampler.close()


def test_a_gpu_that_cannot_list_its_processes_reads_none_and_is_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from crashdrill.workers.telemetry import ProcessSampler

    asked: list[object] = []

    def refuse(handle: object) -> list[object]:
        asked.append(handle)
        raise FakeNotSupported()

    nv = FakeNvml().module()
    nv.nvmlDeviceGetComputeRunningProcesses = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = ProcessSampler(min_interval_s=0.0)
    me = os.getpid()
    assert sampler.read([me])[me].gpu_mem_bytes is None
    assert sampler.read([me])[me].gpu_mem_bytes is None
    assert len(asked) == 1
    sampler.close()


def test_without_a_gpu_a_rank_process_reads_cpu_and_memory_and_no_gpu(no_nvml: None) -> None:
    from crashdrill.workers.telemetry import ProcessSampler

    sampler = ProcessSampler(min_interval_s=0.0)
    me = os.getpid()
    first, second = sampler.read([me])[me], sampler.read([me])[me]
    assert first.cpu_pct is None and second.cpu_pct is not None
    assert second.rss_bytes and second.gpu_mem_bytes is None
    sampler.close()

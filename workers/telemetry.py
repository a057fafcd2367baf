"""Machine telemetry: one sampler per machine, one `telemetry` run record every 2 s.

    sampler = TelemetrySampler(price_per_kwh=0.15, rent_per_hour=2.50)
    sampler.start(lambda sample: records.append(sample.to_record()), interval_s=2.0)
    ...
    sampler.close()

Its own cost: `python benchmarks/telemetry_overhead.py`.

GPU fields come from NVML (`workers/nvml.py`) and are None when unsupported or when there
is no NVIDIA GPU; host fields come from psutil counter deltas; energy is NVML's
total-energy counter on a GPU machine and the CPU packages' RAPL counters otherwise.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from .nvml import GpuReading, GpuState, NvmlGpu, open_gpu

log = logging.getLogger(__name__)

EnergySource = Literal["nvml", "rapl"]
POWERCAP_ROOT = Path("/sys/class/powercap")
_J_PER_KWH = 3.6e6
# Only top-level zones: intel-rapl:0:0 (core, uncore, dram) are parts of package 0 or
# separate rails, and summing them with their package would count energy twice.
_RAPL_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")


@dataclass(frozen=True)
class TelemetrySample:
    """One machine sample. Rates are per second over the interval since the previous
    sample, so they are None on the sampler's first sample (it sets the baselines)."""

    t: float  # unix time
    gpu_state: GpuState
    gpu_reason: str | None  # why there is no GPU reading; None when gpu_state == "ok"
    gpu_name: str | None
    gpu_util_pct: float | None
    vram_used_bytes: int | None
    vram_total_bytes: int | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    mem_bus_util_pct: float | None
    fan_pct: float | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    cpu_pct: float | None  # whole machine, 0..100
    ram_used_bytes: int
    ram_total_bytes: int
    disk_read_bytes_s: float | None
    disk_write_bytes_s: float | None
    net_in_bytes_s: float | None
    net_out_bytes_s: float | None
    power_now_w: float | None  # GPU board power, or CPU package power from RAPL
    energy_source: EnergySource | None
    energy_j_total: float | None  # since the sampler's first sample
    energy_kwh_total: float | None
    cost_power_usd: float | None
    cost_rent_usd: float
    gpu_unsupported: tuple[str, ...]  # GPU fields NVML refused; None by design, not lost

    def to_record(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["gpu_unsupported"] = list(self.gpu_unsupported)
        return {"v": 1, "kind": "telemetry", **fields}


@dataclass(frozen=True)
class _RaplZone:
    energy_path: Path
    max_range_uj: int | None


class RaplMeter:
    """CPU package energy from Linux powercap (RAPL). Since 2020 kernels make
    `energy_uj` root-only; an unreadable counter is remembered and not read again."""

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        self._zones = _discover_rapl_packages(root)
        self._prev_uj: list[int] | None = None
        self.unreadable_reason: str | None = (
            None if self._zones else f"no RAPL package zones under {root}"
        )

    @property
    def available(self) -> bool:
        return self.unreadable_reason is None

    def delta_j(self) -> float | None:
        """Joules used by all packages since the previous call; None on the first call."""
        if not self.available:
            return None
        try:
            now_uj = [int(zone.energy_path.read_text()) for zone in self._zones]
        except (OSError, ValueError) as exc:
            self.unreadable_reason = f"RAPL unreadable: {exc}"
            log.info("%s; CPU energy will not be reported", self.unreadable_reason)
            return None
        prev_uj, self._prev_uj = self._prev_uj, now_uj
        if prev_uj is None:
            return None
        total_uj = 0
        for zone, before, after in zip(self._zones, prev_uj, now_uj, strict=True):
            step = after - before
            if step < 0:
                # The counter wraps at max_energy_range_uj (every few minutes on a busy
                # server); without the range we cannot tell how far, so count nothing.
                step = step + zone.max_range_uj if zone.max_range_uj else 0
            total_uj += max(step, 0)
        return total_uj / 1e6


def _discover_rapl_packages(root: Path) -> list[_RaplZone]:
    zones: list[_RaplZone] = []
    for zone_dir in sorted(root.glob("intel-rapl:*")):
        if not _RAPL_PACKAGE_ZONE.fullmatch(zone_dir.name):
            continue
        try:
            name = (zone_dir / "name").read_text().strip()
        except OSError:
            name = ""
        # "psys" is the whole platform, packages included: summing it would double count.
        if name and not name.startswith("package"):
            continue
        try:
            max_range_uj: int | None = int((zone_dir / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            max_range_uj = None
        zones.append(_RaplZone(zone_dir / "energy_uj", max_range_uj))
    return zones


@dataclass(frozen=True)
class _HostCounters:
    """Cumulative host counters at one moment; two of them make the rates."""

    at: float  # monotonic seconds
    cpu_times: Any  # psutil's scputimes named tuple
    disk_read: int | None
    disk_write: int | None
    net_in: int | None
    net_out: int | None


def _read_host_counters(at: float) -> _HostCounters:
    cpu_times = psutil.cpu_times()
    try:
        # None (or an exception on some psutil versions) in containers with no disks.
        disk = psutil.disk_io_counters()
    except Exception:
        disk = None
    try:
        nics = psutil.net_io_counters(pernic=True)
    except Exception:
        nics = {}
    # Loopback is the server talking to its own workers, not traffic anyone pays for.
    outside = [c for name, c in nics.items() if not name.startswith("lo")]
    return _HostCounters(
        at=at,
        cpu_times=cpu_times,
        disk_read=disk.read_bytes if disk else None,
        disk_write=disk.write_bytes if disk else None,
        net_in=sum(c.bytes_recv for c in outside) if outside else None,
        net_out=sum(c.bytes_sent for c in outside) if outside else None,
    )


def _rate(before: int | None, after: int | None, elapsed_s: float) -> float | None:
    if before is None or after is None or elapsed_s <= 0:
        return None
    # A counter that went backwards was reset (device re-attached, nowrap cache lost).
    return max(after - before, 0) / elapsed_s


def _cpu_total_and_idle(times: Any) -> tuple[float, float]:
    total = float(sum(times))
    # Linux counts guest time inside user/nice already (psutil and htop do the same).
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    # iowait is time the CPU did nothing, waiting on disks: idle for our purpose.
    return total, times.idle + getattr(times, "iowait", 0.0)


def _cpu_busy_pct(before: Any, after: Any) -> float | None:
    # Computed from our own cpu_times pair rather than psutil.cpu_percent(), whose
    # baseline is shared with every other caller in the process.
    total_before, idle_before = _cpu_total_and_idle(before)
    total_after, idle_after = _cpu_total_and_idle(after)
    total = total_after - total_before
    if total <= 0:
        return None  # both reads fell in the same clock tick
    busy = total - max(idle_after - idle_before, 0.0)
    return min(max(busy / total * 100.0, 0.0), 100.0)


def _check_non_negative(name: str, value: float, unit: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0 ({unit}), got {value!r}")


def _check_interval(interval_s: float) -> None:
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")


class TelemetrySampler:
    """Samples this machine; `sample()` on demand, or `start()` a background thread."""

    def __init__(
        self,
        price_per_kwh: float = 0.15,
        rent_per_hour: float = 0.0,
        gpu_index: int = 0,
        *,
        powercap_root: Path = POWERCAP_ROOT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_non_negative("price_per_kwh", price_per_kwh, "$ per kWh")
        _check_non_negative("rent_per_hour", rent_per_hour, "$ per hour")
        if gpu_index < 0:
            raise ValueError(f"gpu_index must be >= 0, got {gpu_index}")
        self.price_per_kwh = price_per_kwh
        self.rent_per_hour = rent_per_hour
        self._monotonic = monotonic
        self._gpu: NvmlGpu = open_gpu(gpu_index)
        self._powercap_root = powercap_root
        self._rapl: RaplMeter | None = None  # only looked for on machines without GPU
        self._lock = threading.Lock()  # sample() from a caller while the thread runs
        self._started_at: float | None = None
        self._prev: _HostCounters | None = None
        self._energy_source: EnergySource | None = None
        self._prev_energy_mj: float | None = None
        self._energy_j_total = 0.0
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    @property
    def gpu(self) -> NvmlGpu:
        return self._gpu

    def sample(self) -> TelemetrySample:
        with self._lock:
            return self._sample()

    def _sample(self) -> TelemetrySample:
        now = self._monotonic()
        gpu = self._gpu.read()
        host = _read_host_counters(now)
        if self._started_at is None:
            self._started_at = now
            self._energy_source = self._choose_energy_source(gpu)
        started_at = self._started_at
        # On the first sample the baseline is the sample itself: elapsed 0, rates None.
        prev, self._prev = (self._prev or host), host
        elapsed_s = host.at - prev.at

        delta_j = self._energy_delta_j(gpu)
        if delta_j is not None:
            self._energy_j_total += delta_j
        power_now_w = gpu.power_w
        if power_now_w is None and delta_j is not None and elapsed_s > 0:
            power_now_w = delta_j / elapsed_s
        has_energy = self._energy_source is not None
        energy_kwh = self._energy_j_total / _J_PER_KWH if has_energy else None
        rent_hours = (now - started_at) / 3600.0

        memory = psutil.virtual_memory()
        return TelemetrySample(
            t=time.time(),
            gpu_state=self._gpu.state,
            gpu_reason=self._gpu.reason,
            gpu_name=self._gpu.name,
            gpu_util_pct=gpu.gpu_util_pct,
            vram_used_bytes=gpu.vram_used_bytes,
            vram_total_bytes=gpu.vram_total_bytes,
            power_w=gpu.power_w,
            power_limit_w=gpu.power_limit_w,
            temp_c=gpu.temp_c,
            sm_clock_mhz=gpu.sm_clock_mhz,
            mem_bus_util_pct=gpu.mem_bus_util_pct,
            fan_pct=gpu.fan_pct,
            pcie_tx_bytes_s=gpu.pcie_tx_bytes_s,
            pcie_rx_bytes_s=gpu.pcie_rx_bytes_s,
            cpu_pct=_cpu_busy_pct(prev.cpu_times, host.cpu_times),
            # total - available, not psutil's `used`: page cache the kernel can drop on
            # demand is not memory a training run is short of.
            ram_used_bytes=int(memory.total - memory.available),
            ram_total_bytes=int(memory.total),
            disk_read_bytes_s=_rate(prev.disk_read, host.disk_read, elapsed_s),
            disk_write_bytes_s=_rate(prev.disk_write, host.disk_write, elapsed_s),
            net_in_bytes_s=_rate(prev.net_in, host.net_in, elapsed_s),
            net_out_bytes_s=_rate(prev.net_out, host.net_out, elapsed_s),
            power_now_w=power_now_w,
            energy_source=self._energy_source,
            energy_j_total=self._energy_j_total if has_energy else None,
            energy_kwh_total=energy_kwh,
            cost_power_usd=energy_kwh * self.price_per_kwh if energy_kwh is not None else None,
            cost_rent_usd=rent_hours * self.rent_per_hour,
            gpu_unsupported=self._gpu.unsupported_fields,
        )

    def _choose_energy_source(self, gpu: GpuReading) -> EnergySource | None:
        if self._gpu.state == "ok":
            # A GPU box's bill is mostly the GPU; CPU RAPL alone would understate it.
            return "nvml" if gpu.energy_counter_mj is not None else None
        self._rapl = RaplMeter(self._powercap_root)
        return "rapl" if self._rapl.available else None

    def _energy_delta_j(self, gpu: GpuReading) -> float | None:
        if self._energy_source == "nvml":
            counter_mj = gpu.energy_counter_mj
            if counter_mj is None:
                return None
            before, self._prev_energy_mj = self._prev_energy_mj, counter_mj
            if before is None:
                return None
            # The counter restarts from 0 when the driver reloads: count nothing then.
            return max(counter_mj - before, 0.0) / 1000.0
        if self._energy_source == "rapl" and self._rapl is not None:
            return self._rapl.delta_j()
        return None

    def run(
        self,
        callback: Callable[[TelemetrySample], None],
        interval_s: float = 2.0,
        *,
        stop_event: threading.Event,
    ) -> None:
        """Sample every `interval_s` on a fixed grid until `stop_event` is set."""
        _check_interval(interval_s)
        next_at = time.monotonic()
        while not stop_event.is_set():
            try:
                callback(self.sample())
            except Exception:
                # Telemetry is a side channel: a full disk or a bad record must not
                # silence it for the rest of the run.
                log.exception("telemetry sample or callback failed; sampler keeps running")
            now = time.monotonic()
            next_at += interval_s
            if next_at <= now:
                # Fell behind (slow callback, suspended machine): skip the missed ticks
                # instead of firing them back to back.
                next_at += interval_s * (math.floor((now - next_at) / interval_s) + 1)
            stop_event.wait(next_at - now)

    def start(self, callback: Callable[[TelemetrySample], None], interval_s: float = 2.0) -> None:
        """Run the sampler in a daemon thread; `stop()` ends it."""
        _check_interval(interval_s)
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("telemetry sampler already running; call stop() first")
        self._stop_event = threading.Event()
        self._thread = threading.Thread(
            target=self.run,
            args=(callback, interval_s),
            kwargs={"stop_event": self._stop_event},
            name="telemetry-sampler",
            daemon=True,
        )
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the background thread; it wakes at once unless a sample is in flight."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("telemetry sampler did not stop within %.1f s", timeout_s)

    def close(self) -> None:
        """Stop the thread and release NVML."""
        self.stop()
        with self._lock:
            self._gpu.close()


# ---------------------------------------------------------------- one process each


@dataclass(frozen=True)
class ProcessReading:
    """One process (a rank of a run): its CPU over the interval since the previous reading
    (% of one core: 100 is one core busy; None on the first reading) and its memory."""

    pid: int
    cpu_pct: float | None
    rss_bytes: int | None
    gpu_mem_bytes: int | None  # None: no GPU, or NVML cannot list its processes


class ProcessSampler:
    """CPU and memory of given processes (a run's ranks, by the pids its ranks file says).

        sampler = ProcessSampler()
        sampler.read([4250, 4251])   # {4250: ProcessReading(…), 4251: …}

    A reading of a pid newer than `min_interval_s` is served again instead of read (the
    lab's views ask often, and a CPU share over a few milliseconds says nothing); a pid
    that is gone is forgotten. GPU memory per process comes from NVML where a GPU is,
    opened on the first read; without one it is None and NVML is not asked again."""

    def __init__(self, min_interval_s: float = 1.0, *, gpu_index: int = 0) -> None:
        self.min_interval_s = min_interval_s
        self._gpu_index = gpu_index
        self._gpu: NvmlGpu | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, tuple[float, ProcessReading]] = {}
        self._lock = threading.Lock()

    def read(self, pids: list[int]) -> dict[int, ProcessReading]:
        with self._lock:
            now = time.monotonic()
            fresh = [
                p for p in pids if now - self._last.get(p, (-1e9, None))[0] >= self.min_interval_s
            ]
            gpu = self._gpu_memory() if fresh else {}
            for pid in fresh:
                reading = self._read_one(pid, gpu)
                if reading is None:
                    self._procs.pop(pid, None)
                    self._last.pop(pid, None)
                else:
                    self._last[pid] = (now, reading)
            return {p: self._last[p][1] for p in pids if p in self._last}

    def _read_one(self, pid: int, gpu: dict[int, int] | None) -> ProcessReading | None:
        proc = self._procs.get(pid)
        first = proc is None
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_percent(None)  # since this object's previous call
                rss = int(proc.memory_info().rss)
        except (psutil.Error, OSError):
            return None
        return ProcessReading(
            pid, None if first else round(cpu, 1), rss, None if gpu is None else gpu.get(pid, 0)
        )

    def _gpu_memory(self) -> dict[int, int] | None:
        if self._gpu is None:
            self._gpu = open_gpu(self._gpu_index)
        return self._gpu.process_memory()

    def close(self) -> None:
        with self._lock:
            if self._gpu is not None:
                self._gpu.close()
            self._procs.clear()
            self._last.clear()

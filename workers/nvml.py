"""One NVIDIA GPU read through NVML (`nvidia-ml-py`, imported as `pynvml`).

Every query that NVML refuses once (not supported on this board, no permission, missing
from an old driver) is remembered and never called again: a datacenter board without a
fan answers NotSupported forever, and asking every 2 s for hours only costs CPU time.
Nothing here raises: a machine without NVIDIA GPU, driver or package gives a
`NvmlGpu` whose state says why and whose readings are all None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any, Literal

log = logging.getLogger(__name__)

GpuState = Literal["ok", "no_gpu", "nvml_error"]

# NVML reports PCIe throughput in KB/s; nvitop and gpustat read that as KiB/s.
_KIB = 1024


@dataclass(frozen=True)
class GpuReading:
    """One read of the GPU; None where the field is unsupported or there is no GPU."""

    gpu_util_pct: float | None = None
    mem_bus_util_pct: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    fan_pct: float | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    # Raw NVML counter (mJ since the driver loaded); the sampler turns it into deltas.
    energy_counter_mj: float | None = None


_Values = tuple[float | int, ...]


@dataclass(frozen=True)
class _Query:
    """One NVML call and the reading fields it fills."""

    name: str
    fields: tuple[str, ...]
    read: Callable[[ModuleType, Any], _Values]


def _utilization(nv: ModuleType, handle: Any) -> _Values:
    # `.memory` is the share of the last sample period in which device memory was read
    # or written: the memory-bus busy %, not VRAM occupancy.
    rates = nv.nvmlDeviceGetUtilizationRates(handle)
    return float(rates.gpu), float(rates.memory)


def _memory(nv: ModuleType, handle: Any) -> _Values:
    info = nv.nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.total)


def _pcie(counter_name: str) -> Callable[[ModuleType, Any], _Values]:
    def read(nv: ModuleType, handle: Any) -> _Values:
        # NVML samples the bus for about 20 ms inside this call: wall time, not CPU time.
        kib_s = nv.nvmlDeviceGetPcieThroughput(handle, getattr(nv, counter_name))
        return (float(kib_s) * _KIB,)

    return read


_QUERIES: tuple[_Query, ...] = (
    _Query("utilization", ("gpu_util_pct", "mem_bus_util_pct"), _utilization),
    _Query("memory", ("vram_used_bytes", "vram_total_bytes"), _memory),
    _Query(
        "power",
        ("power_w",),
        lambda nv, h: (nv.nvmlDeviceGetPowerUsage(h) / 1000.0,),  # mW
    ),
    _Query(
        "power_limit",
        ("power_limit_w",),
        lambda nv, h: (nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,),  # mW
    ),
    _Query(
        "temperature",
        ("temp_c",),
        lambda nv, h: (float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),),
    ),
    _Query(
        "sm_clock",
        ("sm_clock_mhz",),
        lambda nv, h: (float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),),
    ),
    _Query("fan", ("fan_pct",), lambda nv, h: (float(nv.nvmlDeviceGetFanSpeed(h)),)),
    _Query("pcie_tx", ("pcie_tx_bytes_s",), _pcie("NVML_PCIE_UTIL_TX_BYTES")),
    _Query("pcie_rx", ("pcie_rx_bytes_s",), _pcie("NVML_PCIE_UTIL_RX_BYTES")),
    _Query(
        "energy",
        ("energy_counter_mj",),
        lambda nv, h: (float(nv.nvmlDeviceGetTotalEnergyConsumption(h)),),
    ),
)

GPU_READING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(GpuReading))


class NvmlGpu:
    """One GPU opened through NVML, or the reason there is none; build with `open_gpu`."""

    def __init__(
        self,
        state: GpuState,
        reason: str | None,
        nvml: ModuleType | None = None,
        handle: Any = None,
        name: str | None = None,
    ) -> None:
        self.state: GpuState = state
        self.reason = reason
        self.name = name
        self._nvml = nvml
        self._handle = handle
        # query name -> NVML's message from the one time it failed
        self._unsupported: dict[str, str] = {}

    @property
    def unsupported_fields(self) -> tuple[str, ...]:
        """Reading fields NVML refused once and that are no longer asked for."""
        refused = {f for q in _QUERIES if q.name in self._unsupported for f in q.fields}
        return tuple(f for f in GPU_READING_FIELDS if f in refused)

    @property
    def unsupported_reasons(self) -> dict[str, str]:
        return dict(self._unsupported)

    def read(self) -> GpuReading:
        if self.state != "ok" or self._nvml is None:
            return GpuReading()
        nv = self._nvml
        nvml_error: type[BaseException] = getattr(nv, "NVMLError", Exception)
        values: dict[str, Any] = {}
        for query in _QUERIES:
            if query.name in self._unsupported:
                continue
            try:
                values.update(zip(query.fields, query.read(nv, self._handle), strict=True))
            except (nvml_error, AttributeError) as exc:
                # AttributeError: bindings older than the function. Any NVMLError is
                # remembered, not only NotSupported: the sampler must stay cheap, and a
                # board that refuses a field once almost always refuses it for good.
                self._unsupported[query.name] = f"{type(exc).__name__}: {exc}"
                log.info("NVML %s unavailable, not asking again: %s", query.name, exc)
        return GpuReading(**values)

    def process_memory(self) -> dict[int, int] | None:
        """GPU memory in bytes used by each compute process on this GPU, by pid (None: no
        GPU, or NVML cannot list its processes)."""
        if self.state != "ok" or self._nvml is None or "processes" in self._unsupported:
            return None
        nv = self._nvml
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except (getattr(nv, "NVMLError", Exception), AttributeError) as exc:
            self._unsupported["processes"] = f"{type(exc).__name__}: {exc}"
            return None
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}

    def close(self) -> None:
        """Release NVML (it counts nvmlInit calls); later reads return no values."""
        if self._nvml is not None and self.state == "ok":
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", exc)
        self.state, self.reason, self._nvml = "no_gpu", "NVML closed", None


def _nvml_error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def open_gpu(gpu_index: int = 0) -> NvmlGpu:
    """Open GPU `gpu_index`; never raises, the returned state says what happened."""
    try:
        import pynvml as nv
    except Exception as exc:  # ImportError, or a broken install failing at import
        return NvmlGpu("no_gpu", f"nvidia-ml-py (pynvml) not importable: {exc}")

    try:
        nv.nvmlInit()
    except Exception as exc:
        # No driver library or no loaded driver is the ordinary CPU-only machine; any
        # other failure (version mismatch, permissions) is a broken GPU setup to report.
        absent = {
            getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
            getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
        }
        state: GpuState = "no_gpu" if _nvml_error_code(exc) in absent else "nvml_error"
        return NvmlGpu(state, f"nvmlInit failed: {exc}")

    try:
        count = int(nv.nvmlDeviceGetCount())
        if count == 0:
            nv.nvmlShutdown()
            return NvmlGpu("no_gpu", "NVML found no NVIDIA GPU")
        if not 0 <= gpu_index < count:
            nv.nvmlShutdown()
            return NvmlGpu(
                "nvml_error", f"gpu_index={gpu_index} but this machine has GPUs 0..{count - 1}"
            )
        handle = nv.nvmlDeviceGetHandleByIndex(gpu_index)
        try:
            raw_name = nv.nvmlDeviceGetName(handle)
            # Older bindings return bytes, newer ones str.
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        except Exception:
            name = None
    except Exception as exc:
        try:
            nv.nvmlShutdown()
        except Exception as shutdown_exc:
            log.debug("nvmlShutdown after failed open: %s", shutdown_exc)
        return NvmlGpu("nvml_error", f"opening GPU {gpu_index} failed: {exc}")
    return NvmlGpu("ok", None, nvml=nv, handle=handle, name=name)

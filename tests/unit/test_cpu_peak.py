"""The CPU peak MFU divides by (trainer/metrics.py cpu_peak): one core's matmul rate over
its own CPU time, times the threads, so that a trainer starting beside busy ones (the lab's
pair) does not measure a third of the truth and show MFU over 100 %."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crashdrill.trainer import metrics


def test_the_peak_is_one_core_s_rate_times_the_threads_measured_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHDRILL_CACHE_DIR", str(tmp_path))
    one, text = metrics.cpu_peak(1)
    assert one > 1e9 and "one core on this CPU" in text and "× 1 thread(s)" in text

    def measured_again() -> float:
        raise AssertionError("the cached figure is measured again")

    monkeypatch.setattr(metrics, "_one_core_flops", measured_again)
    four, text = metrics.cpu_peak(4)
    assert four == pytest.approx(4 * one) and "× 4 thread(s)" in text


def test_busy_processes_beside_it_do_not_lower_the_measured_rate() -> None:
    idle = metrics._one_core_flops()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        loaded = metrics._one_core_flops()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # Over the wall clock it came out at 1/3 to 1/50 of the idle figure here.
    assert loaded > 0.6 * idle, (loaded, idle)

"""What a run card's rank line says after its state (web/static/ranks.js `rankDetail`), run
in node: when a lost rank was noticed, how long a blind launcher's survivor still waits,
and a live rank's CPU and memory (GPU memory only where a GPU reported it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")


def detail(rank: dict[str, Any], now: float) -> str:
    module = json.dumps((STATIC / "ranks.js").as_uri())
    code = f"import({module}).then((m) => console.log(m.rankDetail({json.dumps(rank)}, {now})))"
    assert NODE is not None
    return subprocess.run(
        [NODE, "-e", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_rank_line_says_when_a_rank_was_lost_and_how_long_a_survivor_still_waits() -> None:
    lost = {"rank": 1, "state": "lost", "at": None, "cpu_pct": None, "rss_bytes": None}
    assert detail(lost, 100.0) == "its process is gone"
    waiting = {"rank": 0, "state": "waiting", "until": 112.2, "cpu_pct": 0.4, "rss_bytes": 2.5e8}
    assert detail(waiting, 100.0) == "in its collective, times out in 13 s · 0% CPU · 250.0 MB"


def test_a_training_rank_line_gives_its_process_s_cpu_and_memory_and_gpu_only_with_one() -> None:
    cpu = {
        "rank": 0,
        "state": "training",
        "cpu_pct": 97.6,
        "rss_bytes": 2.124e8,
        "gpu_mem_bytes": None,
    }
    assert detail(cpu, 0) == "98% CPU · 212.4 MB"
    gpu = {**cpu, "gpu_mem_bytes": 3.2e9}
    assert detail(gpu, 0) == "98% CPU · 212.4 MB · 3.2 GB GPU"

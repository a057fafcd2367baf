"""A restarted group of ranks forked from a warm process finds the rank loop (torch.distributed,
DCP, DDP and the torch._dynamo DDP's constructor imports) already imported: about 1.8 s of
its crash → first recomputed step on the 2-core machine (benchmarks/ranks.py)."""

from __future__ import annotations

import subprocess
import sys

from crashdrill.drill.builtin import ranks_preload
from crashdrill.processes.forkserver import RANKS_PRELOAD
from crashdrill.workers.warm import WarmTrainers


def test_the_lab_s_warm_process_imports_the_rank_loop() -> None:
    assert RANKS_PRELOAD == ["crashdrill.trainer.rank_loop"]
    assert set(RANKS_PRELOAD) <= set(WarmTrainers(enabled=False).preload)


def test_the_drill_preloads_the_rank_loop_for_several_ranks_only() -> None:
    assert ranks_preload("quick", "A", ["ranks=2"]) == RANKS_PRELOAD
    assert ranks_preload("quick", "A", []) == []  # a one-rank drill waits for no more imports
    assert ranks_preload("no-such-preset", "A", []) == []  # PresetTarget says what is wrong


def test_the_rank_loop_imports_what_a_restarted_rank_would_import_late() -> None:
    """torch.load's serialization config (DCP's load) and the profiler module the first
    record_function of DDP's forward imports: both in a warm process, not after each fork."""
    code = (
        "import sys, crashdrill.trainer.rank_loop\n"
        "print(all(m in sys.modules for m in "
        "('torch.utils.serialization.config', 'torch.profiler._cupti_monitor')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr

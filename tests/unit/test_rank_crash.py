"""What the supervisor's crash event says of a lost rank (workers/rank_crash.py), read from
the ranks file a launcher wrote: a launcher that watches took the group down, a blind one
left the survivors to their collective's timeout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil

from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.rank_crash import RankTarget, blind_wait, lost_rank_fields, rank_lead
from crashdrill.workers.run_dir import RunDir


def _run_dir(tmp_path: Path, lost: dict[str, Any]) -> RunDir:
    said = {"launcher": 10, "world": 2, "crash_rank": 1, "pids": {"0": 11, "1": 12}, "lost": lost}
    (tmp_path / RANKS_FILE).write_text(json.dumps(said))
    return RunDir(tmp_path)


def _target() -> RankTarget:
    return RankTarget(1, 12, 2, psutil.Process(), killed_at=100.0)


def test_a_watching_launcher_s_crash_event_says_it_took_the_group_down(tmp_path: Path) -> None:
    rd = _run_dir(tmp_path, {"rank": 1, "status": 137, "noticed_at": 100.02})
    fields = lost_rank_fields(rd, _target())
    assert fields == {"lost_rank": 1, "noticed_s": 0.02}
    assert blind_wait(rd) is None
    lead = rank_lead(_target(), fields, 13, blind_wait(rd))
    assert lead.endswith("its launcher noticed in 20 ms and took the group down"), lead


def test_a_blind_launcher_s_crash_event_says_how_long_the_survivors_waited(
    tmp_path: Path,
) -> None:
    lost = {"rank": 1, "status": 137, "noticed_at": 100.02, "deadline": 115.02,
            "launcher": "blind", "timed_out": {"rank": 0, "at": 115.07}}  # fmt: skip
    rd = _run_dir(tmp_path, lost)
    assert blind_wait(rd) == 15.05
    lead = rank_lead(_target(), lost_rank_fields(rd, _target()), 13, blind_wait(rd))
    assert "took the group down" not in lead
    assert lead.endswith("the others waited 15.1 s in their collective until it timed out"
                         " and the group ended"), lead  # fmt: skip

"""A run's ranks as its view shows them (`ranks` in GET /api/pairs/{pair} and in the
stream's `run` messages): each rank's state (workers/rank_states.py, the one home of the
words) and its process's CPU and memory (workers/telemetry.py ProcessSampler).

    ranks_view(row, latest, preset)   # None for a run of one rank
    # [{"rank": 0, "state": "training", "pid": 4250, "at": None, "until": None,
    #   "cpu_pct": 97.5, "rss_bytes": 212000000, "gpu_mem_bytes": None}, …]

The world size is the run's own (its newest `run` record), else its lesson's (the knob's
value for the run when the knob is `ranks`, else `[run] ranks`). A process is read only
while its rank is alive; the sampler serves a reading at most once a second, so a view
built often costs two small /proc reads a second per rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crashdrill.server.storage.db import Row
from crashdrill.trainer.ranks import read_ranks_file
from crashdrill.trainer.run_files import RANKS_FILE
from crashdrill.workers.rank_crash import pids_are_here
from crashdrill.workers.rank_states import RankState, states_said
from crashdrill.workers.telemetry import ProcessSampler

# The lab's one sampler of rank processes (its readings are the same for every view).
SAMPLER = ProcessSampler()
# A rank whose process is alive and may be read.
_RUNNING = (RankState.STARTING, RankState.TRAINING, RankState.WAITING)


def world_of(label: str, latest: Mapping[str, Any], preset: Mapping[str, Any]) -> int:
    """How many ranks the run trains on."""
    run = latest.get("run") or {}
    for value in (run.get("ranks"), (run.get("config") or {}).get("ranks")):
        if isinstance(value, int) and value >= 1:
            return value
    knob = preset.get("knob") or {}
    if knob.get("name") == "ranks":
        value = knob.get("a") if label == "A" else knob.get("b")
        if isinstance(value, int) and value >= 1:
            return value
    side = preset.get(label.lower()) or {}
    value = side.get("ranks", (preset.get("run") or {}).get("ranks", 1))
    return value if isinstance(value, int) and value >= 1 else 1


def ranks_view(
    row: Row, latest: Mapping[str, Any], preset: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """Each rank of a run of several: its state, pid and process telemetry (None: one rank)."""
    world = world_of(str(row["label"]), latest, preset)
    if world <= 1:
        return None
    run_dir = row.get("run_dir")
    said = read_ranks_file(Path(run_dir) / RANKS_FILE) if run_dir else None  # read once
    statuses = states_said(
        said, str(row["state"]), row.get("stage"), trainer_pid=row.get("pid"), world=world
    )
    here = said is None or pids_are_here(said)  # a cluster node's pids are not read here
    pids = [s.pid for s in statuses if s.pid is not None and s.state in _RUNNING and here]
    readings = SAMPLER.read(pids) if pids else {}
    out = []
    for status in statuses:
        running = status.pid is not None and status.state in _RUNNING
        reading = readings.get(status.pid) if running and status.pid is not None else None
        out.append(
            {
                **status.to_dict(),
                "cpu_pct": reading.cpu_pct if reading else None,
                "rss_bytes": reading.rss_bytes if reading else None,
                "gpu_mem_bytes": reading.gpu_mem_bytes if reading else None,
            }
        )
    return out

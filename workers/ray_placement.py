"""Where a run goes on a Ray cluster: what it asks for, which nodes could take it, the
file that remembers its actor, and the event while it waits for a node.

    need = Resources.of_preset("quick", "A", gpus=False)   # Resources(num_cpus=1, num_gpus=0)
    alive_nodes(need)                                    # ids of live nodes that have it
    write_placement(run_dir, {"actor": name, "attempt": 2, "node_id": ..., "name": ...})

workers/ray_executor.py places the actors; this module holds its rules, and needs Ray only
for `alive_nodes`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.presets import PresetError, get_preset
from crashdrill.workers.run_dir import RunDir

PLACEMENT = "ray.json"  # in the server's copy of the run dir: the actor of its placement
TELL_S = 5.0  # a placement waiting this long says so in the run's log
PLACE_S = 600.0  # and fails after this long (CRASHDRILL_RAY_PLACE_S)


@dataclass(frozen=True)
class Resources:
    num_cpus: float
    num_gpus: float

    @classmethod
    def of_preset(cls, preset_ref: str, label: str = "A", *, gpus: bool = False) -> Resources:
        """A CUDA run asks for one GPU; any other run for its `threads` CPUs. `gpus`: the
        cluster has GPUs, so a run on device "auto" trains on one (with the preset's
        [run.cuda] settings), as it would on a machine with a GPU."""
        try:
            cfg = get_preset(preset_ref).config_for(label, cuda=gpus)
        except (PresetError, ValueError):
            return cls(1, 0)
        if cfg.device == "cuda" or (gpus and cfg.device == "auto"):
            return cls(1, 1)
        return cls(max(1, cfg.threads), 0)

    def text(self) -> str:
        if self.num_gpus:
            return f"{self.num_gpus:g} GPU" + ("s" if self.num_gpus != 1 else "")
        return f"{self.num_cpus:g} CPU" + ("s" if self.num_cpus != 1 else "")


def place_s() -> float:
    try:
        return float(os.environ.get("CRASHDRILL_RAY_PLACE_S", PLACE_S))
    except ValueError:
        return PLACE_S


def waiting_event(run_dir: Path, need: Resources) -> dict[str, Any]:
    segment = 0
    for rec in RunDir(run_dir).tail_records(64 * 1024):
        if isinstance(rec.get("segment"), int):
            segment = max(segment, rec["segment"])
    text = (
        f"Waiting for a node of the Ray cluster with {need.text()} free: none has them now."
        " The run starts as soon as one does (a node that joins the cluster counts)."
    )
    return build_event("waiting_for_node", text, segment=segment)


def alive_nodes(need: Resources | None = None) -> list[str]:
    """Ids of the live nodes (with at least `need` in total resources)."""
    import ray

    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        if need is not None and (
            res.get("CPU", 0) < need.num_cpus or res.get("GPU", 0) < need.num_gpus
        ):
            continue
        out.append(str(node["NodeID"]))
    return out


def read_placement(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / PLACEMENT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_placement(run_dir: Path, data: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (PLACEMENT + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, run_dir / PLACEMENT)

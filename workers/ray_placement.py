"""Where a run goes on a Ray cluster: what it asks for, which nodes could take it, the
file that remembers its actor, and the event while it waits for a node.

    need = Resources.of_preset("quick", "A", gpus=False)   # Resources(num_cpus=1, num_gpus=0)
    alive_nodes(need)                                    # ids of live nodes that have it
    write_placement(run_dir, {"actor": name, "attempt": 2, "node_id": ..., "name": ...})

workers/ray_executor.py places the actors; this module holds its rules, and needs Ray only
for `alive_nodes` and `nodes_with_room` (the resources each node has free now).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashdrill.trainer.event_record import event as build_event
from crashdrill.trainer.presets import PresetError, get_preset
from crashdrill.workers.launch import Launch
from crashdrill.workers.run_dir import RunDir

PLACEMENT = "ray.json"  # in the server's copy of the run dir: the actor of its placement
TELL_S = 5.0  # a placement waiting this long says so in the run's log
PLACE_S = 600.0  # and fails after this long (CRASHDRILL_RAY_PLACE_S)

# How fast the cluster declares a node dead: the head's system config (`ray start --head
# --system-config '…'`; Cluster(head_node_args={"_system_config": …}) in tests). Ray's
# defaults (a check every 3 s, dead after 5 failures) take ~15 s, most of a lost host's
# cost; these take ~1.5 s for a node whose raylet is gone (refused at once) and up to
# ~4.5 s for a silent one (each check waits its timeout). Until the head says the node is
# dead, a call to its actors just waits: the run's death reaches the supervisor with it.
NODE_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


@dataclass(frozen=True)
class Resources:
    """What one rank of a run takes (its actor, or each bundle of its placement group)."""

    num_cpus: float
    num_gpus: float
    ranks: int = 1
    spread: bool = False  # one rank per node (placement = "spread"), else all on one

    @classmethod
    def of_preset(cls, preset_ref: str, label: str = "A", *, gpus: bool = False) -> Resources:
        """A CUDA run asks for one GPU; any other run for its `threads` CPUs. `gpus`: the
        cluster has GPUs, so a run on device "auto" trains on one (with the preset's
        [run.cuda] settings), as it would on a machine with a GPU."""
        try:
            cfg = get_preset(preset_ref).config_for(label, cuda=gpus)
        except (PresetError, ValueError):
            return cls(1, 0)
        spread = cfg.placement == "spread"
        if cfg.device == "cuda" or (gpus and cfg.device == "auto"):
            return cls(1, 1, cfg.ranks, spread)
        return cls(max(1, cfg.threads), 0, cfg.ranks, spread)

    @classmethod
    def of_launch(cls, launch: Launch, *, gpus: bool = False) -> Resources:
        """What the launch's trainer takes: its preset's, at the world size of its last
        `--set ranks=N` (a lesson's restart_ranks, a restart on fewer ranks)."""
        need = cls.of_preset(launch.preset, launch.label, gpus=gpus)
        ranks = launch.ranks()
        return need.with_ranks(ranks) if ranks is not None else need

    def with_ranks(self, ranks: int) -> Resources:
        return Resources(self.num_cpus, self.num_gpus, ranks, self.spread)

    @property
    def nodes(self) -> int:
        """How many nodes the group takes: one per rank when spread, else one."""
        return self.ranks if self.spread and self.ranks > 1 else 1

    @property
    def strategy(self) -> str:
        """Ray's placement strategy for the group: each bundle on a node of its own, or all
        on one."""
        return "STRICT_SPREAD" if self.nodes > 1 else "STRICT_PACK"

    @property
    def per_node(self) -> int:
        """Ranks on each node of the group."""
        return self.ranks // self.nodes

    def fits(self, free: dict[str, float]) -> bool:
        """A node with `free` resources takes its share of the group (the whole group when
        it is packed on one; one rank when spread)."""
        return (
            free.get("CPU", 0) >= self.num_cpus * self.per_node
            and free.get("GPU", 0) >= self.num_gpus * self.per_node
        )

    def bundles(self) -> list[dict[str, float]]:
        """The run's placement group: one bundle per rank."""
        one = {"CPU": self.num_cpus, "GPU": self.num_gpus}
        return [{k: v for k, v in one.items() if v} for _ in range(self.ranks)]

    def text(self) -> str:
        """ "1 CPU", "2 CPUs (2 ranks of 1 CPU)": what a node must have free."""

        def amount(n: float) -> str:
            unit = "GPU" if self.num_gpus else "CPU"
            return f"{n:g} {unit}" + ("s" if n != 1 else "")

        one = self.num_gpus or self.num_cpus
        if self.ranks == 1:
            return amount(one)
        if self.nodes > 1:
            return f"{amount(one)} on each of {self.nodes} nodes (one rank a node)"
        return f"{amount(one * self.ranks)} ({self.ranks} ranks of {amount(one)})"


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


def held_by(group: Any) -> dict[str, dict[str, float]]:
    """What the placement group `group` holds on each node now. A lost node's group is
    rescheduled by Ray at once, onto whichever node has room: what it holds there is the
    run's own, free for its new placement (which replaces the group)."""
    from ray.util.placement_group import placement_group_table

    held: dict[str, dict[str, float]] = {}
    if group is None:
        return held
    try:
        table = placement_group_table(group)
    except Exception:  # removed meanwhile
        return held
    for index, node in (table.get("bundles_to_node_id") or {}).items():
        bundle = (table.get("bundles") or {}).get(index) or {}
        mine = held.setdefault(str(node), {})
        for name, amount in bundle.items():
            mine[name] = mine.get(name, 0.0) + float(amount)
    return held


def nodes_with_room(
    need: Resources, avoid: str | None = None, own: dict[str, dict[str, float]] | None = None
) -> list[str]:
    """Ids of the live nodes (not `avoid`) whose resources free now take the whole group,
    counting what the run's own group holds there (`own`, held_by) as free. Other runs'
    placement groups hold theirs; Ray's view may lag by a heartbeat."""
    from ray._private.state import available_resources_per_node

    out = []
    for node, free in available_resources_per_node().items():
        mine = (own or {}).get(node, {})
        total = {k: free.get(k, 0.0) + mine.get(k, 0.0) for k in {*free, *mine}}
        if node != avoid and need.fits(total):
            out.append(node)
    return out


def has_room(
    need: Resources, avoid: str | None = None, own: dict[str, dict[str, float]] | None = None
) -> bool:
    """The live nodes (not `avoid`) have room free now for the whole group: one node for a
    packed group, a node per rank for a spread one."""
    return len(nodes_with_room(need, avoid, own)) >= need.nodes


def most_ranks_with_room(
    need: Resources, avoid: str | None = None, own: dict[str, dict[str, float]] | None = None
) -> int:
    """The largest world size up to need.ranks whose group the live nodes (not `avoid`)
    have free room for now; 0: none, not even one rank."""
    for ranks in range(need.ranks, 0, -1):
        if has_room(need.with_ranks(ranks), avoid, own):
            return ranks
    return 0


def alive_nodes(need: Resources | None = None) -> list[str]:
    """Ids of the live nodes (with at least `need` in total resources)."""
    import ray

    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        if need is not None and not need.fits(res):  # its share of the group in total
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

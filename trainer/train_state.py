"""The training state a checkpoint holds, as one map of its parts, and its way back in.

    parts = state_map(cfg, model, opt, sampler, st)   # {"weights": model, "optimizer": opt, …}
    files, names = state_files(cfg, parts, st, fingerprints)   # what CheckpointWriter saves
    names = restore(info, cfg, fingerprints, parts, st)        # a verified checkpoint, back in

Every part has its own `state_dict()` / `load_state_dict()` (the idea of torchtitan's
checkpointer): saving and loading iterate the map, and where each part's state dict lies in
the files is the layout's table (`checkpoint_layout.PARTS`: file and key, and the word the
events use). Adding a part is one entry there and its object in `state_map`; a test holds
the two to the same names.

Beside the parts, every checkpoint (a weights-only one too) carries the loop's counters
(`TrainState`: step and tokens; with the full state also the best val loss and the eval
window's step losses) and the header (config, fingerprints, format version), at the top
level of train_state.pt. `restore` refuses a checkpoint written for another config or
dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer import determinism
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.optim import AdamW


class CheckpointMismatch(ValueError):
    """A checkpoint written by a different config or dataset: resuming it would silently
    train something else."""


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], /) -> Any: ...


@dataclass
class TrainState:
    """The loop's counters."""

    step: int = 0
    tokens: int = 0
    best_val: float | None = None
    # The last `eval_every` step losses, newest last: a `val` record's train_loss is their
    # mean, so a resume must get them back (or its first eval averages fewer steps).
    loss_window: list[float] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens": self.tokens,
            "best_val": self.best_val,
            "loss_window": list(self.loss_window),  # Python floats: exact, no pickle needed
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.best_val = state.get("best_val")
        # Absent from a weights-only checkpoint, and from one written before the window was
        # kept (the same format otherwise): the first eval after such a resume averages
        # fewer steps, and the resume check shows it as a differing val.train_loss.
        self.loss_window = [float(x) for x in state.get("loss_window", [])]


# What a weights-only checkpoint keeps of the counters: "the weights and the step".
_WEIGHTS_ONLY_COUNTERS = ("step", "tokens")


@dataclass
class Schedule:
    """The LR schedule's position. The schedule is a pure function of the step (lr_at), so
    loading needs nothing from it; it is saved for whoever reads a checkpoint."""

    cfg: TrainConfig
    st: TrainState

    def state_dict(self) -> dict[str, Any]:
        step = self.st.step
        return {"step": step, "lr": lr_at(step, self.cfg), "warmup": self.cfg.warmup}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class RngStreams:
    """Every global RNG stream the loop touches (determinism.py), as tensors and ints."""

    def state_dict(self) -> dict[str, Any]:
        return determinism.get_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        determinism.set_rng_state(state)


def state_map(
    cfg: TrainConfig, model: GPT, opt: AdamW, sampler: BatchSampler, st: TrainState
) -> dict[str, Stateful]:
    """The training state's parts by name, in the layout's order (checkpoint_layout.PARTS)."""
    parts: dict[str, Stateful] = {
        "weights": model,
        "optimizer": opt,
        "schedule": Schedule(cfg, st),
        "rng": RngStreams(),
        "data": sampler,
    }
    if tuple(parts) != layout.PARTS_FULL:
        raise AssertionError(f"state_map names {tuple(parts)}, the layout {layout.PARTS_FULL}")
    return parts


def state_files(
    cfg: TrainConfig,
    parts: dict[str, Stateful],
    st: TrainState,
    fingerprints: dict[str, str],
) -> tuple[dict[str, Any], list[str]]:
    """The files of a checkpoint (file stem → state tree) and the parts they hold."""
    names = ck.PARTS_WEIGHTS if cfg.ckpt_state == "weights" else ck.PARTS_FULL
    counters = st.state_dict()
    if names == ck.PARTS_WEIGHTS:
        counters = {k: counters[k] for k in _WEIGHTS_ONLY_COUNTERS}
    top = {
        "step": counters.pop("step"),
        "tokens": counters.pop("tokens"),
        "config": cfg.to_dict(),
        "fingerprints": fingerprints,
        "format": layout.FORMAT_VERSION,
        **counters,
    }
    files: dict[str, Any] = {}
    for name in names:
        where = layout.PARTS[name]
        if where.key is None:
            files[where.file] = parts[name].state_dict()
        else:
            files.setdefault(where.file, {})[where.key] = parts[name].state_dict()
    # the header first in train_state.pt, and that file last (the order it always had)
    files[layout.TRAIN_STATE_FILE] = {**top, **files.pop(layout.TRAIN_STATE_FILE, {})}
    return files, list(names)


def restore(
    info: layout.CheckpointInfo,
    cfg: TrainConfig,
    fingerprints: dict[str, str],
    parts: dict[str, Stateful],
    st: TrainState,
) -> list[str]:
    """Load the verified checkpoint `info` into `parts` and `st`; returns the parts it held."""
    files = ck.load_files(info)
    ts = files[layout.TRAIN_STATE_FILE]
    for name, want in fingerprints.items():
        got = ts.get("fingerprints", {}).get(name)
        if got != want:
            raise CheckpointMismatch(
                f"checkpoint {info.path} was written by a different {name} "
                f"(fingerprint {name}: checkpoint {got}, this run {want}); refusing to resume "
                "it. Use a fresh --run-dir, or the settings that wrote it"
            )
    held = [name for name in info.manifest.get("parts", ck.PARTS_FULL) if name in parts]
    states = {name: _state_in(files, name) for name in held}
    if "data" in states:
        consumed = int(states["data"]["samples_consumed"])
        if consumed != int(ts["step"]) * cfg.batch:
            raise layout.CorruptCheckpoint(
                f"{info.path.name}: data cursor says {consumed} samples "
                f"consumed, step × batch = {int(ts['step']) * cfg.batch}"
            )
    st.load_state_dict(ts)
    for name, state in states.items():
        parts[name].load_state_dict(state)
    return list(info.manifest.get("parts", ck.PARTS_FULL))


def _state_in(files: dict[str, Any], name: str) -> Any:
    where = layout.PARTS[name]
    return files[where.file] if where.key is None else files[where.file][where.key]

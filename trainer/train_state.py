"""The training state a checkpoint holds, as the union of its parts' state dicts, and
its way back in: `state_files` gives the files a checkpoint writes (model, optimizer,
train_state: step, tokens, schedule, data cursor, RNG streams, the eval window's step
losses, config, fingerprints);
`restore` loads a verified checkpoint into the model, optimizer, sampler and TrainState,
refusing one written for another config or dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    best_val: float | None = None
    # The last `eval_every` step losses, newest last: a `val` record's train_loss is their
    # mean, so a resume must get them back (or its first eval averages fewer steps).
    loss_window: list[float] = field(default_factory=list)


def state_files(
    cfg: TrainConfig,
    model: GPT,
    opt: AdamW,
    sampler: BatchSampler,
    st: TrainState,
    fingerprints: dict[str, str],
) -> tuple[dict[str, Any], list[str]]:
    base = {
        "step": st.step,
        "tokens": st.tokens,
        "config": cfg.to_dict(),
        "fingerprints": fingerprints,
        "format": layout.FORMAT_VERSION,
    }
    if cfg.ckpt_state == "weights":
        return {"model": model.state_dict(), "train_state": base}, list(ck.PARTS_WEIGHTS)
    train_state = {
        **base,
        "best_val": st.best_val,
        "loss_window": list(st.loss_window),  # Python floats: exact, no pickle needed
        "schedule": {"step": st.step, "lr": lr_at(st.step, cfg), "warmup": cfg.warmup},
        "data": sampler.state_dict(),
        "rng": determinism.get_rng_state(),
    }
    files = {"model": model.state_dict(), "optimizer": opt.state_dict(), "train_state": train_state}
    return files, list(ck.PARTS_FULL)


def restore(
    info: layout.CheckpointInfo,
    cfg: TrainConfig,
    fingerprints: dict[str, str],
    model: GPT,
    opt: AdamW,
    sampler: BatchSampler,
    st: TrainState,
) -> list[str]:
    files = ck.load_files(info)
    ts = files["train_state"]
    for name, want in fingerprints.items():
        got = ts.get("fingerprints", {}).get(name)
        if got != want:
            raise CheckpointMismatch(
                f"checkpoint {info.path} was written by a different {name} "
                f"(fingerprint {name}: checkpoint {got}, this run {want}); refusing to resume "
                "it. Use a fresh --run-dir, or the settings that wrote it"
            )
    model.load_state_dict(files["model"])
    st.step, st.tokens = int(ts["step"]), int(ts["tokens"])
    if "optimizer" in files:
        opt.load_state_dict(files["optimizer"])
        sampler.load_state_dict(ts["data"])
        if sampler.samples_consumed != st.step * cfg.batch:
            raise layout.CorruptCheckpoint(
                f"{info.path.name}: data cursor says {sampler.samples_consumed} samples "
                f"consumed, step × batch = {st.step * cfg.batch}"
            )
        determinism.set_rng_state(ts["rng"])
        st.best_val = ts.get("best_val")
        # Absent from a checkpoint written before the window was kept (the same format
        # otherwise): the first eval after such a resume averages fewer steps, and the
        # resume check shows it as a differing val.train_loss.
        st.loss_window = [float(x) for x in ts.get("loss_window", [])]
    return list(info.manifest.get("parts", ck.PARTS_FULL))

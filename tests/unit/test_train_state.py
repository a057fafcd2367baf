"""The training state as one map of parts (trainer/train_state.py): saving and loading
iterate it, its names are the layout's parts, and the files on disk keep format 1 — a
checkpoint written before the map (the file contents spelled out below, as the trainer
wrote them) restores every part."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from crashdrill.trainer import checkpoint as ck
from crashdrill.trainer import checkpoint_layout as layout
from crashdrill.trainer import determinism
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.train_state import (
    CheckpointMismatch,
    TrainState,
    restore,
    state_files,
    state_map,
)

CFG = TrainConfig(n_layer=1, d_model=16, n_head=2, ctx=8, batch=2, steps=10, warmup=2)
VOCAB = 32
FINGERPRINTS = {"config": CFG.fingerprint(), "dataset": "d"}


def trained(cfg: TrainConfig = CFG, steps: int = 3) -> tuple[Any, ...]:
    """A model, optimizer, sampler and counters after `steps` real steps."""
    determinism.seed_all(cfg.seed)
    model = GPT(cfg, VOCAB)
    opt = model.configure_optimizer(cfg)
    sampler = BatchSampler(np.arange(2000, dtype=np.uint16) % VOCAB, cfg)
    st = TrainState()
    for _ in range(steps):
        x, y = sampler.next_batch()
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
        st.step += 1
        st.tokens += x.numel()
        st.loss_window.append(float(loss.detach()))
    st.best_val = 2.5
    return model, opt, sampler, st


def fresh(cfg: TrainConfig = CFG) -> tuple[Any, ...]:
    determinism.seed_all(cfg.seed + 1)  # other weights and RNG streams than `trained`'s
    model = GPT(cfg, VOCAB)
    opt = model.configure_optimizer(cfg)
    return model, opt, BatchSampler(np.arange(2000, dtype=np.uint16) % VOCAB, cfg), TrainState()


def save(
    tmp_path: Path, step: int, files: dict[str, Any], parts: list[str]
) -> layout.CheckpointInfo:
    ck.CheckpointWriter(tmp_path).save(step, files, {"parts": parts})
    info = layout.find_latest(tmp_path)
    assert info is not None
    return info


def assert_same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    (model_a, opt_a, sampler_a, st_a), (model_b, opt_b, sampler_b, st_b) = a, b
    for (name, pa), pb in zip(
        model_a.state_dict().items(), model_b.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
    assert torch.equal(
        opt_a.state_dict()["state"][0]["exp_avg"], opt_b.state_dict()["state"][0]["exp_avg"]
    )
    assert sampler_a.samples_consumed == sampler_b.samples_consumed
    assert torch.equal(sampler_a.generator.get_state(), sampler_b.generator.get_state())
    assert st_a == st_b


def test_the_state_map_names_exactly_the_layout_s_parts_in_its_order() -> None:
    model, opt, sampler, st = fresh()
    assert tuple(state_map(CFG, model, opt, sampler, st)) == layout.PARTS_FULL
    assert {n: p.word for n, p in layout.PARTS.items()} == ck.PART_WORDS


def test_a_full_checkpoint_keeps_the_files_and_keys_of_format_1() -> None:
    model, opt, sampler, st = trained()
    files, parts = state_files(CFG, state_map(CFG, model, opt, sampler, st), st, FINGERPRINTS)
    assert parts == list(layout.PARTS_FULL)
    assert list(files) == ["model", "optimizer", "train_state"]
    assert set(files["train_state"]) == {
        "step", "tokens", "config", "fingerprints", "format",
        "best_val", "loss_window", "schedule", "data", "rng",
    }  # fmt: skip
    ts = files["train_state"]
    assert (ts["step"], ts["format"], ts["config"]) == (3, 1, CFG.to_dict())
    assert ts["schedule"] == {"step": 3, "lr": lr_at(3, CFG), "warmup": CFG.warmup}
    assert ts["data"]["samples_consumed"] == 3 * CFG.batch
    assert set(ts["rng"]) >= {"python", "numpy", "torch_cpu"}


def test_a_weights_only_checkpoint_holds_the_weights_and_the_step_alone() -> None:
    cfg = CFG.with_overrides({"ckpt_state": "weights"})
    model, opt, sampler, st = trained(cfg)
    files, parts = state_files(cfg, state_map(cfg, model, opt, sampler, st), st, FINGERPRINTS)
    assert parts == ["weights"] and list(files) == ["model", "train_state"]
    assert set(files["train_state"]) == {"step", "tokens", "config", "fingerprints", "format"}


def test_restoring_a_checkpoint_gives_back_every_part_and_the_rng_streams(tmp_path: Path) -> None:
    saved = trained()
    model, opt, sampler, st = saved
    files, parts = state_files(CFG, state_map(CFG, model, opt, sampler, st), st, FINGERPRINTS)
    info = save(tmp_path, st.step, files, parts)
    draws = (random.random(), float(np.random.rand()), torch.rand(1))
    back = fresh()
    assert restore(info, CFG, FINGERPRINTS, state_map(CFG, *back), back[3]) == parts
    assert_same_state(saved, back)
    assert (random.random(), float(np.random.rand()), torch.rand(1)) == draws


def test_a_checkpoint_written_before_the_state_map_restores_every_part(tmp_path: Path) -> None:
    saved = trained()
    model, opt, sampler, st = saved
    old_train_state = {  # the trainer's train_state.pt before the map, key for key
        "step": st.step,
        "tokens": st.tokens,
        "config": CFG.to_dict(),
        "fingerprints": FINGERPRINTS,
        "format": 1,
        "best_val": st.best_val,
        "loss_window": list(st.loss_window),
        "schedule": {"step": st.step, "lr": lr_at(st.step, CFG), "warmup": CFG.warmup},
        "data": sampler.state_dict(),
        "rng": determinism.get_rng_state(),
    }
    files = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "train_state": old_train_state,
    }
    info = save(tmp_path, st.step, files, ["weights", "optimizer", "schedule", "rng", "data"])
    back = fresh()
    restore(info, CFG, FINGERPRINTS, state_map(CFG, *back), back[3])
    assert_same_state(saved, back)


def test_a_weights_only_checkpoint_restores_the_weights_and_leaves_the_rest_fresh(
    tmp_path: Path,
) -> None:
    cfg = CFG.with_overrides({"ckpt_state": "weights"})
    model, opt, sampler, st = trained(cfg)
    files, parts = state_files(cfg, state_map(cfg, model, opt, sampler, st), st, FINGERPRINTS)
    info = save(tmp_path, st.step, files, parts)
    b_model, b_opt, b_sampler, b_st = fresh(cfg)
    assert restore(
        info, cfg, FINGERPRINTS, state_map(cfg, b_model, b_opt, b_sampler, b_st), b_st
    ) == ["weights"]
    assert torch.equal(b_model.head.weight, model.head.weight)
    assert not b_opt.state_dict()["state"][0]["exp_avg"].any()  # the moments start over
    assert b_sampler.samples_consumed == 0
    assert (b_st.step, b_st.tokens, b_st.best_val, b_st.loss_window) == (3, st.tokens, None, [])


def test_a_checkpoint_of_another_config_is_refused_naming_the_fingerprint(tmp_path: Path) -> None:
    model, opt, sampler, st = trained()
    files, parts = state_files(CFG, state_map(CFG, model, opt, sampler, st), st, FINGERPRINTS)
    info = save(tmp_path, st.step, files, parts)
    back = fresh()
    with pytest.raises(CheckpointMismatch, match="fingerprint config"):
        restore(info, CFG, {**FINGERPRINTS, "config": "other"}, state_map(CFG, *back), back[3])


def test_a_data_cursor_that_disagrees_with_the_step_is_refused_before_anything_loads(
    tmp_path: Path,
) -> None:
    model, opt, sampler, st = trained()
    files, parts = state_files(CFG, state_map(CFG, model, opt, sampler, st), st, FINGERPRINTS)
    files["train_state"]["step"] = 2  # 3 batches consumed
    info = save(tmp_path, 2, files, parts)
    back = fresh()
    before = back[0].head.weight.clone()
    with pytest.raises(layout.CorruptCheckpoint, match="data cursor says 6 samples consumed"):
        restore(info, CFG, FINGERPRINTS, state_map(CFG, *back), back[3])
    assert torch.equal(back[0].head.weight, before) and back[3].step == 0

from __future__ import annotations

import random

import numpy as np
import torch

from crashdrill.trainer import determinism


def _draws() -> tuple:
    return (random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_rng_state_round_trip_continues_every_stream():
    determinism.seed_all(5)
    _draws()
    state = determinism.get_rng_state()
    expected = _draws()
    determinism.seed_all(99)  # a different stream in between
    determinism.set_rng_state(state)
    assert _draws() == expected


def test_rng_state_survives_weights_only_save(tmp_path):
    determinism.seed_all(1)
    state = determinism.get_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    expected = _draws()
    determinism.set_rng_state(loaded)
    assert _draws() == expected

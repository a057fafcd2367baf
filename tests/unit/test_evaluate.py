from __future__ import annotations

import torch

from crashdrill.trainer import evaluate
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import ByteTokenizer
from crashdrill.trainer.model import GPT


def test_probes_and_samples_leave_training_rng_and_mode_alone():
    cfg = TrainConfig(n_layer=1, d_model=32, n_head=4, ctx=32, sample_tokens=10)
    model = GPT(cfg, vocab=256).train()
    tok = ByteTokenizer()
    torch.manual_seed(3)
    before = torch.get_rng_state()
    probes = evaluate.probes(model, tok, torch.device("cpu"))
    a = evaluate.sample(model, tok, cfg, torch.device("cpu"))
    b = evaluate.sample(model, tok, cfg, torch.device("cpu"))
    assert torch.equal(before, torch.get_rng_state())
    assert model.training
    assert a == b and a.startswith(evaluate.SAMPLE_PROMPT)
    assert set(probes) >= {"paris", "water", "planet", "whale", "arithmetic"}
    assert all(0.0 <= p <= 1.0 for p in probes.values())

from __future__ import annotations

import math

import torch

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.model import GPT, lr_at


def test_forward_shapes_and_initial_loss_near_ln_vocab():
    cfg = TrainConfig(n_layer=2, d_model=32, n_head=4, ctx=16)
    torch.manual_seed(0)
    model = GPT(cfg, vocab=256)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (3, 16), generator=g)
    y = torch.randint(0, 256, (3, 16), generator=g)
    logits, loss = model(x, y)
    assert logits.shape == (3, 16, 256)
    assert abs(float(loss.detach()) - math.log(256)) < 0.3


def test_head_is_tied_to_token_embedding():
    model = GPT(TrainConfig(d_model=32, n_head=4), vocab=256)
    assert model.head.weight is model.tok_emb.weight


def test_attention_is_causal():
    cfg = TrainConfig(n_layer=1, d_model=32, n_head=4, ctx=8)
    model = GPT(cfg, vocab=50).eval()
    x = torch.randint(0, 50, (1, 8))
    y = x.clone()
    y[0, -1] = (x[0, -1] + 1) % 50  # change only the last token
    a, _ = model(x)
    b, _ = model(y)
    assert torch.equal(a[0, :-1], b[0, :-1])


def test_lr_warms_up_linearly_then_decays_to_min():
    cfg = TrainConfig(steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, cfg) == 1e-4
    assert math.isclose(lr_at(9, cfg), 1e-3)
    assert lr_at(50, cfg) < lr_at(20, cfg)
    assert math.isclose(lr_at(100, cfg), 1e-4)


def test_optimizer_decays_matrices_only():
    model = GPT(TrainConfig(d_model=32, n_head=4), vocab=64)
    opt = model.configure_optimizer(TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0

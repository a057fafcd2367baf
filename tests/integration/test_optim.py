from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.model import GPT
from crashdrill.trainer.optim import AdamW


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TrainConfig(n_layer=1, d_model=32, n_head=4, ctx=8), vocab=64)


def _train(model: GPT, opt, steps: int) -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randint(0, 64, (2, 8), generator=g)
        _, loss = model(x, x.roll(1, dims=1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def test_matches_torch_optim_adamw_bit_for_bit():
    ours, ref = _model(), _model()
    cfg = TrainConfig(weight_decay=0.1, lr=3e-3)
    opt = ours.configure_optimizer(cfg)
    decay = [p for p in ref.parameters() if p.dim() >= 2]
    rest = [p for p in ref.parameters() if p.dim() < 2]
    ref_opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(cfg.beta1, cfg.beta2),
        foreach=False,
    )
    _train(ours, opt, 5)
    _train(ref, ref_opt, 5)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_exists_before_the_first_step_and_round_trips_weights_only(tmp_path):
    model = _model()
    opt = model.configure_optimizer(TrainConfig())
    assert len(opt.state_dict()["state"]) == len(list(model.parameters()))
    _train(model, opt, 3)
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    clone = _model(1)
    clone.load_state_dict(model.state_dict())
    opt2 = clone.configure_optimizer(TrainConfig())
    opt2.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    _train(model, opt, 2)
    _train(clone, opt2, 2)
    for a, b in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(a, b)


def test_loading_a_state_for_another_model_is_refused():
    small = _model()
    big = GPT(TrainConfig(n_layer=2, d_model=32, n_head=4, ctx=8), vocab=64)
    with pytest.raises(ValueError, match="optimizer state holds"):
        big.configure_optimizer(TrainConfig()).load_state_dict(
            small.configure_optimizer(TrainConfig()).state_dict()
        )
    assert isinstance(small.configure_optimizer(TrainConfig()), AdamW)


def test_training_does_not_import_the_compiler_stack():
    code = (
        "import sys, torch\n"
        "from crashdrill.trainer.config import TrainConfig\n"
        "from crashdrill.trainer.model import GPT\n"
        "m = GPT(TrainConfig(n_layer=1, d_model=32, n_head=4, ctx=8), vocab=64)\n"
        "o = m.configure_optimizer(TrainConfig())\n"
        "x = torch.randint(0, 64, (2, 8)); _, l = m(x, x); l.backward()\n"
        "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); o.step()\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

"""What we look at while a run trains: validation loss, fact probes, samples.

None of these may touch an RNG that training uses: validation uses the same fixed batches
every time, probes are exact log-probabilities, and samples draw from a private generator
seeded the same way every time — so only the model changes between two samples.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.corpus import PROBES
from crashdrill.trainer.data import Tokenizer, fixed_batches
from crashdrill.trainer.model import GPT

SAMPLE_PROMPT = "Water is"
SAMPLE_SEED = 7
VAL_SEED = 1234


@torch.no_grad()
def val_loss(model: GPT, val: np.ndarray, cfg: TrainConfig, device: torch.device) -> float:
    was_training = model.training
    model.eval()
    losses = []
    for x, y in fixed_batches(val, cfg, cfg.eval_batches, VAL_SEED):
        with _autocast(device, cfg):
            _, loss = model(x.to(device), y.to(device))
        assert loss is not None
        losses.append(float(loss))
    model.train(was_training)
    return sum(losses) / len(losses)


@torch.no_grad()
def _logprob(model: GPT, tok: Tokenizer, prompt: str, cont: str, device: torch.device) -> float:
    """log P(cont | prompt), summed over the continuation's tokens."""
    p_ids = tok.encode(prompt)
    c_ids = tok.encode(cont)
    ids = (p_ids + c_ids)[-model.cfg.ctx - 1 :]
    n_c = min(len(c_ids), len(ids) - 1)
    x = torch.tensor(ids[:-1], device=device)[None]
    logits, _ = model(x)
    logp = F.log_softmax(logits[0].float(), dim=-1)  # (T, vocab)
    targets = torch.tensor(ids[1:], device=device)
    picked = logp[torch.arange(len(targets), device=device), targets]
    return float(picked[-n_c:].sum())


@torch.no_grad()
def probes(model: GPT, tok: Tokenizer, device: torch.device) -> dict[str, float]:
    """P(right) / (P(right) + P(wrong)) per question: 0.5 = no idea, 1 = sure and right."""
    was_training = model.training
    model.eval()
    out = {}
    for name, prompt, right, wrong in PROBES:
        diff = _logprob(model, tok, prompt, right, device) - _logprob(
            model, tok, prompt, wrong, device
        )
        out[name] = round(1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, diff)))), 4)
    model.train(was_training)
    return out


@torch.no_grad()
def sample(
    model: GPT, tok: Tokenizer, cfg: TrainConfig, device: torch.device, prompt: str = SAMPLE_PROMPT
) -> str:
    """The same prompt and the same random draw every time (a private generator)."""
    was_training = model.training
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(SAMPLE_SEED)
    ids = tok.encode(prompt)
    for _ in range(cfg.sample_tokens):
        x = torch.tensor(ids[-cfg.ctx :], device=device)[None]
        logits, _ = model(x)
        probs = F.softmax(logits[0, -1].float().cpu() / 0.8, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=g)))
    model.train(was_training)
    return tok.decode(ids)


def _autocast(device: torch.device, cfg: TrainConfig) -> torch.autocast:
    return torch.autocast(
        device_type=device.type,
        dtype=torch.bfloat16,
        enabled=cfg.precision == "bf16",
    )

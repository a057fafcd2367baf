"""Trainer throughput and checkpoint overhead, measured in one run.

    .venv/bin/python benchmarks/trainer_throughput.py [--preset lesson-1.7] [--steps 200]
    .venv/bin/python benchmarks/trainer_throughput.py --smoke   # CI size: quick, 30 steps, 1 trial

Prints:
  1. tokens/s of crashdrill's loop (records every step, loss bits, grad norm, schedule)
     against a plain PyTorch loop of the same model shape, batch and thread count —
     target ratio ≥ 0.95;
  2. training-time overhead of checkpointing every 10 steps against never, sync and async
     (CheckFreq reports ≤ 3.5 % for its pipelined checkpoints).
Evaluation, probes and samples are switched off so the loops do the same work. Each
variant runs `--trials` times, interleaved, and the best time counts (noise on a shared
machine only ever adds time). A variant that timed no step, or a checkpointing variant
that wrote no checkpoint, measured nothing: the script says which and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from crashdrill.trainer import determinism
from crashdrill.trainer.config import TrainConfig
from crashdrill.trainer.data import BatchSampler, load_dataset
from crashdrill.trainer.loop import RunOptions, train
from crashdrill.trainer.model import GPT, lr_at
from crashdrill.trainer.presets import get_preset
from crashdrill.trainer.run_files import RECORDS_FILE

WARM = 10  # steps excluded from timing: allocator and cache warm-up


def plain_loop(cfg: TrainConfig) -> float:
    """The same model and optimizer in the simplest loop; returns seconds per timed step."""
    determinism.configure(cfg.threads, torch.device("cpu"))
    data = load_dataset(cfg)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg, data.vocab_size)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        foreach=False,
    )
    sampler = BatchSampler(data.train, cfg)
    t0 = 0.0
    for step in range(cfg.steps):
        if step == WARM:
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        assert loss is not None
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    float(loss.detach())
    return (time.perf_counter() - t0) / (cfg.steps - WARM)


class NothingMeasured(Exception):
    """A variant without the steps or checkpoints its figure is made of."""


def trainer_loop(cfg: TrainConfig) -> tuple[float, list[dict]]:
    """crashdrill's loop; seconds per timed step from its own step records (checkpoint
    stalls are charged to the step after them, so they are included)."""
    with tempfile.TemporaryDirectory() as d:
        code = train(cfg, d, RunOptions())
        if code != 0:
            raise NothingMeasured(f"the trainer exited {code}")
        recs = [json.loads(line) for line in (Path(d) / RECORDS_FILE).open()]
    steps = [r for r in recs if r["kind"] == "step"]
    ckpts = [r for r in recs if r["kind"] == "ckpt"]
    timed = [r["dt"] for r in steps if r["step"] > WARM]
    if not timed:
        raise NothingMeasured(f"no step record past the {WARM} warm-up steps")
    return sum(timed) / len(timed), ckpts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="lesson-1.7")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="CI size: quick, 30 steps, 1 trial")
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.steps, args.trials = "quick", 30, 1
    if args.steps <= WARM + 10 or args.trials < 1:
        ap.error(f"--steps > {WARM + 10} (the first {WARM} are not timed; 10 per checkpoint)")
    off = {"eval_every": 10**9, "probe_every": 10**9, "sample_every": 10**9, "sample_tokens": 0}
    base = (
        get_preset(args.preset)
        .config_for("A")
        .with_overrides({"steps": args.steps, "warmup": min(20, args.steps), **off})
    )
    variants = {
        "plain": None,
        "never": base.with_overrides({"ckpt_policy": "end"}),
        "sync": base.with_overrides({"ckpt_every": 10, "ckpt_mode": "sync"}),
        "async": base.with_overrides({"ckpt_every": 10, "ckpt_mode": "async"}),
    }
    best: dict[str, float] = {}
    ckpt_info: dict[str, list[dict]] = {}
    for _ in range(args.trials):
        for name, cfg in variants.items():
            if cfg is None:
                s = plain_loop(base)
            else:
                try:
                    s, ckpt_info[name] = trainer_loop(cfg)
                except NothingMeasured as e:
                    print(f"variant {name!r} measured nothing: {e}")
                    return 1
            best[name] = min(best.get(name, float("inf")), s)
    for mode in ("sync", "async"):
        if not [c for c in ckpt_info[mode] if 0 < c["step"] < base.steps]:
            print(
                f"variant {mode!r} measured nothing: no checkpoint between its first and last step"
            )
            return 1
    tok = base.batch * base.ctx
    print(
        f"preset {args.preset} · {base.n_layer}L·{base.d_model}d · ctx {base.ctx} · "
        f"batch {base.batch} · {base.threads} thread(s) · {args.steps} steps · "
        f"best of {args.trials}"
    )
    print(f"plain PyTorch loop : {tok / best['plain']:10.0f} tokens/s")
    print(
        f"crashdrill trainer : {tok / best['never']:10.0f} tokens/s   "
        f"ratio {best['plain'] / best['never']:.3f} (target ≥ 0.95)"
    )
    for mode in ("sync", "async"):
        over = best[mode] / best["never"] - 1
        # The direct cost, free of run-to-run noise: time the loop stood still in save().
        blocked = sum(c["seconds"] for c in ckpt_info[mode] if 0 < c["step"] < base.steps)
        share = blocked / (best[mode] * (args.steps - WARM))
        print(
            f"checkpoint every 10 steps, {mode:5s}: overhead {over * 100:+.2f} % vs never "
            f"by wall time; training blocked {share * 100:.2f} % of its time "
            "(async target ≤ 3.5 %)"
        )
    sync = [c for c in ckpt_info["sync"] if c["step"] > 0]
    if sync:
        mb = sync[-1]["bytes"] / 1e6
        secs = sorted(c["seconds"] for c in sync)[len(sync) // 2]
        blocked = sorted(c["seconds"] for c in ckpt_info["async"])[len(ckpt_info["async"]) // 2]
        print(
            f"checkpoint size {mb:.2f} MB · sync write {secs * 1000:.1f} ms (median) · "
            f"async blocks training {blocked * 1000:.1f} ms (median)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

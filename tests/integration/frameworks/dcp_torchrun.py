"""A 2-rank DDP run (gloo, CPU) checkpointing with torch.distributed.checkpoint, drilled by
tests/integration/test_verify_frameworks.py.

    crashdrill verify --kills 2 -- torchrun --standalone --nproc_per_node 2 dcp_torchrun.py
    crashdrill verify --kills 2 -- torchrun … dcp_torchrun.py model   # fails: state-missing

Each rank's batch is a pure function of (step, rank), so no RNG state is needed. Every 5
steps `dcp.save` writes step-N/ in $CRASHDRILL_CKPT_DIR: every rank its shard file, then
the coordinator `.metadata`, last, so a dir without `.metadata` is a write a kill
interrupted and a restart resumes from the newest dir that has one. Model and optimizer
state go through `get_state_dict` / `set_state_dict` (the optimizer's moments by parameter
name). Rank 0 prints the all-reduced loss as a JSON line.
argv[1] = "model": only the model is saved; the optimizer's momentum starts over.
"""

import json
import os
import struct
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

FLAW = sys.argv[1] if len(sys.argv) > 1 else "none"
STEPS, EVERY = 20, 5
STEP_SECONDS = 0.05  # a step that takes a while, like a real one: a kill lands where planned
ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
true_w = torch.linspace(-1, 1, 8)
step = 0
done = [
    d
    for d in os.listdir(ROOT)
    if d.startswith("step-") and os.path.exists(os.path.join(ROOT, d, ".metadata"))
]
if done:
    path = os.path.join(ROOT, max(done, key=lambda d: int(d[5:])))
    model_sd, optim_sd = get_state_dict(ddp, opt)
    state: dict[str, Any] = {"model": model_sd, "step": 0}
    if FLAW != "model":
        state["optim"] = optim_sd
    dcp.load(state, checkpoint_id=path)
    if FLAW == "model":
        set_model_state_dict(ddp, state["model"])
    else:
        set_state_dict(ddp, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = state["step"]
    if rank == 0:
        print(f"resumed at step {step} from {path}", file=sys.stderr, flush=True)

while step < STEPS:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    loss = ((ddp(x).squeeze(1) - x @ true_w) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    if rank == 0:
        bits = struct.unpack("<I", struct.pack("<f", mean.item()))[0]
        sys.stdout.write(json.dumps({"step": step, "loss": mean.item(), "loss_bits": bits}) + "\n")
        sys.stdout.flush()
    if step % EVERY == 0:
        model_sd, optim_sd = get_state_dict(ddp, opt)
        state = {"model": model_sd, "step": step}
        if FLAW != "model":
            state["optim"] = optim_sd
        dcp.save(state, checkpoint_id=os.path.join(ROOT, f"step-{step}"))
    time.sleep(STEP_SECONDS)
dist.destroy_process_group()

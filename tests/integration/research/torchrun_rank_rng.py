"""A 2-rank torchrun trainer (gloo, CPU) that saves each rank's own RNG state beside a
torch.distributed.checkpoint (DCP) of the model and optimizer, drilled by
tests/integration/test_verify_ranks.py.

    crashdrill verify --kills 2 -- torchrun --standalone --nproc_per_node 2 --tee 3 \\
        torchrun_rank_rng.py                          # passes bit-identically
    … torchrun_rank_rng.py --flaw rank0-rng           # fails: rank-state, rank 1 named
    … torchrun_rank_rng.py --data global              # elastic: resumes on another world size

Each rank prints its own loss (every rank, as `print` does under torchrun; `--tee 3` gives
the lines their `[defaultR]:` prefix). `--data rank-rng` (the default): each rank draws its
batch from its own generator, seeded by its rank, and saves that generator's state as
`rng-R.pt`; `--flaw rank0-rng` makes every rank restore rank 0's on resume, so after a
restart rank 1 trains on rank 0's batches. `--data global`: each step's global batch is a
pure function of the step, split across the ranks, so the run can resume on another world
size (DCP reshards the model and optimizer); `rank-rng` refuses to (its RNG states are per
rank). A checkpoint is `step-N/` (DCP's `.metadata` and `*.distcp`, `rng-R.pt`,
`meta.json`), written as `tmp-step-N/` and renamed by rank 0 when every rank is done.
"""

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

ap = argparse.ArgumentParser()
ap.add_argument("--flaw", choices=["none", "rank0-rng"], default="none")
ap.add_argument("--data", choices=["rank-rng", "global"], default="rank-rng")
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--every", type=int, default=4)
ap.add_argument("--sleep", type=float, default=0.03)
args = ap.parse_args()

GLOBAL_BATCH = 8
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
root = os.environ["CRASHDRILL_CKPT_DIR"]
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(1000 + rank)
true_w = torch.arange(8, dtype=torch.float32) / 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at `step`: (GLOBAL_BATCH / world, 8) inputs and their targets."""
    if args.data == "global":
        g = torch.Generator().manual_seed(step)  # the whole global batch, split by rank
        x = torch.randn(GLOBAL_BATCH, 8, generator=g)
        noise = torch.randn(GLOBAL_BATCH, generator=g)
        per = GLOBAL_BATCH // world
        x, noise = x[rank * per : (rank + 1) * per], noise[rank * per : (rank + 1) * per]
    else:
        x = torch.randn(GLOBAL_BATCH // world, 8, generator=gen)
        noise = torch.randn(GLOBAL_BATCH // world, generator=gen)
    return x, x @ true_w + 0.01 * noise


step = 0
done = sorted(
    int(d[5:])
    for d in os.listdir(root)
    if d.startswith("step-") and os.path.exists(os.path.join(root, d, ".metadata"))
)
if done:
    path = os.path.join(root, f"step-{done[-1]}")
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    if args.data == "rank-rng" and meta["world_size"] != world:
        sys.exit(
            f"{path}: written by {meta['world_size']} ranks, this run has {world}: each rank's "
            "RNG state is its own, so this checkpoint cannot resume on another world size"
        )
    msd, osd = get_state_dict(model, opt)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = meta["step"]
    if args.data == "rank-rng":
        own = 0 if args.flaw == "rank0-rng" else rank  # the flaw: rank 0's stream for all
        gen.set_state(torch.load(os.path.join(path, f"rng-{own}.pt"), weights_only=True))
    if rank == 0:
        print(f"resumed at step {step} from {path}", file=sys.stderr, flush=True)


def save() -> None:
    tmp, final = os.path.join(root, f"tmp-step-{step}"), os.path.join(root, f"step-{step}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a kill inside an earlier write
        os.makedirs(tmp)
    dist.barrier()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp)  # every rank; .metadata last
    torch.save(gen.get_state(), os.path.join(tmp, f"rng-{rank}.pt"))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"step": step, "world_size": world}, f)
        os.replace(tmp, final)
    dist.barrier()


while step < args.steps:
    x, y = batch(step)
    loss = ((ddp(x).squeeze(1) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    # Every rank prints its own loss, repr'd (exact), one write per line.
    sys.stdout.write(f"step {step} | loss {loss.item()!r}\n")
    sys.stdout.flush()
    if step % args.every == 0:
        save()
    time.sleep(args.sleep)
dist.destroy_process_group()

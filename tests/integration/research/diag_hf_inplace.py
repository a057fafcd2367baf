"""A trainer that writes Hugging Face-style `checkpoint-N/` dirs in place (the dir under
its final name first, then its files one by one), drilled by
tests/integration/test_verify_diagnosis.py.

    crashdrill verify --kills 1 -- python diag_hf_inplace.py   # passes: a non-atomic-write note

Each checkpoint-N/ holds model.pt, optimizer.pt and trainer_state.json (step and the batch
generator's state); a restart loads the newest checkpoint-N/ completely, so a kill between
writes resumes bit for bit. A kill inside a write leaves checkpoint-N/ without its last
files, and the restart then crashes on it: only a kill inside a write shows the bug.
"""

import json
import os
import time

import torch

ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
STEPS, EVERY = 32, 8
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
batches = torch.Generator().manual_seed(7)
step = 0
found = sorted(d for d in os.listdir(ROOT) if d.startswith("checkpoint-"))
if found:
    last = os.path.join(ROOT, found[-1])
    model.load_state_dict(torch.load(os.path.join(last, "model.pt"), weights_only=True))
    opt.load_state_dict(torch.load(os.path.join(last, "optimizer.pt"), weights_only=True))
    with open(os.path.join(last, "trainer_state.json")) as f:
        state = json.load(f)
    step = state["global_step"]
    batches.set_state(torch.tensor(state["rng"], dtype=torch.uint8))
while step < STEPS:
    idx = torch.randint(0, 64, (8,), generator=batches)
    loss = torch.nn.functional.mse_loss(model(x[idx]).squeeze(-1), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
    if step % EVERY == 0:
        out = os.path.join(ROOT, f"checkpoint-{step:04d}")
        os.makedirs(out)
        torch.save(model.state_dict(), os.path.join(out, "model.pt"))
        time.sleep(0.1)  # a bigger model takes a while: the dir is incomplete meanwhile
        torch.save(opt.state_dict(), os.path.join(out, "optimizer.pt"))
        with open(os.path.join(out, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step, "rng": batches.get_state().tolist()}, f)
    time.sleep(0.03)

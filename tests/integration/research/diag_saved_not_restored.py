"""A research-style trainer whose restart restores only part of what it saves, drilled by
tests/integration/test_verify_diagnosis.py.

    crashdrill verify --kills 2 -- python diag_saved_not_restored.py        # saved-not-restored

`state.pt` (written atomically: a temp file, then os.replace) holds the weights, the Adam
state, the step and the batch generator's RNG state; a restart loads the weights, the
optimizer and the step but seeds its batch generator afresh instead of restoring it, so the
first resumed batch is not the one the uninterrupted run drew.
argv[1] = "full": the restart restores the RNG state too (a correct script).
"""

import json
import os
import sys
import time

import torch

FULL = len(sys.argv) > 1 and sys.argv[1] == "full"
ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
CKPT = os.path.join(ROOT, "state.pt")
STEPS, EVERY = 32, 8
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
batches = torch.Generator().manual_seed(7)
step = 0
if os.path.exists(CKPT):
    state = torch.load(CKPT, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step = state["step"]
    if FULL:
        batches.set_state(state["rng"])
while step < STEPS:
    idx = torch.randint(0, 64, (8,), generator=batches)
    loss = torch.nn.functional.mse_loss(model(x[idx]).squeeze(-1), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
    if step % EVERY == 0:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
        state["rng"] = batches.get_state()
        torch.save(state, CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)
    time.sleep(0.03)

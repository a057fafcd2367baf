"""A research-style trainer that saves only its weights and, on a restart, loads them and
counts steps from 0 again, drilled by tests/integration/test_verify_diagnosis.py.

    crashdrill verify --kills 2 -- python diag_weights_only.py      # steps-restarted

`model.pt` holds `model.state_dict()` only (written atomically: a temp file, then
os.replace): no optimizer state, no step, no RNG state. A restart loads the weights,
builds a fresh Adam and trains STEPS steps from step 1 again, as many small research
repos' `--resume` does.
"""

import json
import os
import time

import torch

ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
CKPT = os.path.join(ROOT, "model.pt")
STEPS, EVERY = 32, 8
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
model = torch.nn.Linear(4, 1)
if os.path.exists(CKPT):
    model.load_state_dict(torch.load(CKPT, weights_only=True))
opt = torch.optim.Adam(model.parameters(), lr=0.05)
batches = torch.Generator().manual_seed(7)
for step in range(1, STEPS + 1):
    idx = torch.randint(0, 64, (8,), generator=batches)
    loss = torch.nn.functional.mse_loss(model(x[idx]).squeeze(-1), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
    if step % EVERY == 0:
        torch.save(model.state_dict(), CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)
    time.sleep(0.03)

"""A tiny Lightning run, drilled by tests/integration/test_verify_frameworks.py.

    crashdrill verify --kills 3 -- python lightning_train.py           # passes
    crashdrill verify --kills 3 -- python lightning_train.py shuffle   # fails: state-missing

A linear regression on 32 fixed samples, SGD with momentum and a StepLR schedule, 6
epochs of 4 steps, a checkpoint in $CRASHDRILL_CKPT_DIR at the end of every epoch
(`last.ckpt`, which Lightning writes atomically); a restart resumes with
`ckpt_path="last"`. Each step prints its exact loss as a JSON line.
Lightning's checkpoint holds the model, optimizer, scheduler and loop counters but no RNG
state: the data order here is a function of the epoch (a sampler with `set_epoch`, which
Lightning calls), so nothing is drawn from a global RNG after the start.
argv[1] = "shuffle": `DataLoader(shuffle=True)` instead, whose order each epoch is drawn
from torch's global RNG, which the checkpoint does not hold.
"""

import json
import os
import struct
import sys
import time
import warnings

import lightning as L
import torch

FLAW = sys.argv[1] if len(sys.argv) > 1 else "none"
ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
STEP_SECONDS = 0.05  # a step that takes a while, like a real one: a kill lands where planned
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging


class EpochSampler(torch.utils.data.Sampler):
    """A fresh permutation per epoch, a pure function of the epoch."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        value = loss.detach().float().item()
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        line = {"step": self.global_step + 1, "loss": value, "loss_bits": bits}
        print(json.dumps(line), flush=True)
        time.sleep(STEP_SECONDS)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)]


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1234)
x = torch.randn(32, 8, generator=g)
data = torch.utils.data.TensorDataset(x, x @ torch.linspace(-1, 1, 8))
if FLAW == "shuffle":
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
else:
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=EpochSampler(len(data)))
ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=ROOT, every_n_epochs=1, save_last=True)
trainer = L.Trainer(
    max_epochs=6,
    accelerator="cpu",
    devices=1,
    callbacks=[ckpt],
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    deterministic=True,
)
resume = os.path.exists(os.path.join(ROOT, "last.ckpt"))
trainer.fit(Regression(), loader, ckpt_path="last" if resume else None)

"""A tiny Hugging Face `Trainer` run, drilled by tests/integration/test_verify_frameworks.py.

    crashdrill verify --kills 3 -- python hf_trainer.py            # passes
    crashdrill verify --kills 3 -- python hf_trainer.py weights    # fails: state-missing

A 2-layer regression net on 64 fixed samples, AdamW with a linear LR decay, 24 steps of
8, a `checkpoint-N/` dir in $CRASHDRILL_CKPT_DIR every 4 steps. Each step prints its exact
loss as a JSON line (the Trainer's own log rounds it to 4 digits). On a restart it resumes
from the newest checkpoint the Trainer finished: the Trainer writes `checkpoint-N/` in
place and `trainer_state.json` last, so a dir without it is a write a kill interrupted
(`get_last_checkpoint` would pick it and fail).
argv[1] = "weights": `save_only_model=True`, checkpoints hold the weights only; the
Trainer then resumes without optimizer, scheduler or RNG state and says nothing.
"""

import json
import os
import struct
import sys
import time

import torch
from transformers import Trainer, TrainingArguments

FLAW = sys.argv[1] if len(sys.argv) > 1 else "none"
ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
STEP_SECONDS = 0.05  # a step that takes a while, like a real one: a kill lands where planned
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(64, 8, generator=g)
        self.y = self.x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(64, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        out = self.body(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class PrintingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        value = (loss[0] if return_outputs else loss).detach().float()
        bits = struct.unpack("<I", struct.pack("<f", value.item()))[0]
        step = self.state.global_step + 1
        print(json.dumps({"step": step, "loss": value.item(), "loss_bits": bits}), flush=True)
        time.sleep(STEP_SECONDS)
        return loss


def last_complete(root: str) -> str | None:
    def complete(d: str) -> bool:
        return os.path.isfile(os.path.join(root, d, "trainer_state.json"))

    done = [d for d in os.listdir(root) if d.startswith("checkpoint-") and complete(d)]
    return os.path.join(root, max(done, key=lambda d: int(d.split("-")[1]))) if done else None


torch.manual_seed(0)
args = TrainingArguments(
    output_dir=ROOT,
    max_steps=24,
    per_device_train_batch_size=8,
    learning_rate=0.01,
    lr_scheduler_type="linear",
    save_strategy="steps",
    save_steps=4,
    save_total_limit=2,
    save_only_model=FLAW == "weights",
    logging_strategy="no",
    report_to="none",
    use_cpu=True,
    seed=0,
    disable_tqdm=True,
    dataloader_num_workers=0,
)
trainer = PrintingTrainer(model=Net(), args=args, train_dataset=Data())
resume = last_complete(ROOT)
if resume:
    print(f"resuming from {resume}", file=sys.stderr, flush=True)
trainer.train(resume_from_checkpoint=resume)

"""A training script in nanoGPT's style, drilled with no --loss-regex by
tests/integration/test_verify_adoption.py: it prints `iter N: loss X, time …ms, mfu …%`
and nanoGPT's eval lines (`step N: train loss X, val loss Y`), and resumes with
`--init_from=resume`, as nanoGPT's train.py does.

    crashdrill verify --resume-args=--init_from=resume -- {python} adopt_nanogpt_style.py

Unlike nanoGPT it saves everything a bit-identical resume needs (the weights, AdamW's
moments, the iteration, torch's RNG state: the batches are drawn from it), atomically
(a temp file, fsync, os.replace) every 10 iterations into $CRASHDRILL_CKPT_DIR/ckpt.pt.
The loss is printed with repr(): every float32 bit shows.
"""

import os
import sys
import time

import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
MAX_ITERS, EVAL_INTERVAL, BATCH, BLOCK, VOCAB = 40, 10, 8, 16, 32
out_dir = os.environ["CRASHDRILL_CKPT_DIR"]
ckpt_path = os.path.join(out_dir, "ckpt.pt")
init_from = "scratch"
for arg in sys.argv[1:]:  # nanoGPT's configurator takes --key=value
    if arg.startswith("--init_from="):
        init_from = arg.split("=", 1)[1]

torch.manual_seed(1337)
data = torch.randint(0, VOCAB, (4096,), generator=torch.Generator().manual_seed(7))
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
iter_num = 0
if init_from == "resume":
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    torch.set_rng_state(checkpoint["rng"])


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([data[i : i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
    return x, y


def save() -> None:
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iter_num": iter_num,
        "rng": torch.get_rng_state(),
    }
    tmp = ckpt_path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_path)


while iter_num < MAX_ITERS:
    if iter_num % EVAL_INTERVAL == 0:
        print(f"step {iter_num}: train loss 4.0000, val loss 4.0000")  # as nanoGPT prints
        if iter_num > 0:
            print(f"saving checkpoint to {out_dir}")
            save()
    t0 = time.time()
    x, y = get_batch()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    time.sleep(0.02)  # a step of a real model takes a while: kills land between lines
    dt = time.time() - t0
    print(f"iter {iter_num}: loss {loss.item()!r}, time {dt * 1000:.2f}ms, mfu -100.00%")

"""A training script in the style of small research repos, drilled by
tests/integration/test_verify_research_tb.py (issue 33 §1–2).

    crashdrill verify --kills 2 --loss-regex 'step (?P<step>\\d+) \\| loss (?P<loss>\\S+)' \\
        --resume-args=--resume -- python research_tb_resume.py
    ... --resume-args=--resume --resume-args-always ...   every restart gets --resume

What it shares with the scripts it stands for:
- at every start, before it loads anything, it opens a new TensorBoard-style event file
  `events.out.tfevents.<time>.<host>.<pid>` in its output dir and appends a record to it
  at every step (TFRecord framing written by hand: length, crc, data, crc);
- it also appends a CSV log (`log.csv`) and writes `samples/step-N.txt` at every eval;
- it saves `model.pt` (a pickle, as torch's legacy format is) only when its test loss
  improves, in place, with the weights and the step (`--weights-only`: the weights alone,
  and a resume starts its step counter at 0);
- with `--resume` it loads `model.pt` and crashes when there is none;
- it keeps no optimizer (momentum) or data-order state: a resume is not bit-identical.

Linear regression with SGD + momentum on minibatches, pure Python (a start costs
milliseconds, not torch's import). Output dir: `--out DIR`, else $CRASHDRILL_CKPT_DIR;
RESEARCH_STEP_SECONDS: how long a step sleeps (default 0.02).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import socket
import struct
import time
import zlib

STEPS, EVAL_EVERY, BATCH, LR, MOMENTUM = 80, 5, 8, 0.05, 0.9
STEP_SECONDS = float(os.environ.get("RESEARCH_STEP_SECONDS", "0.02"))  # a test slows it


def _crc(data: bytes) -> int:
    crc = zlib.crc32(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF  # TFRecord's mask


class EventLog:
    """Appends TFRecord-framed records, the way a SummaryWriter does."""

    def __init__(self, out: str) -> None:
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self.f = open(os.path.join(out, name), "ab")  # noqa: SIM115 — open for the whole run
        self.record(b"\x09" + struct.pack("<d", time.time()) + b"\x1a\rbrain.Event:2")

    def record(self, data: bytes) -> None:
        head = struct.pack("<Q", len(data))
        self.f.write(head + struct.pack("<I", _crc(head)) + data + struct.pack("<I", _crc(data)))
        self.f.flush()

    def scalar(self, tag: str, step: int, value: float) -> None:
        self.record(struct.pack("<qd", step, value) + tag.encode())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("CRASHDRILL_CKPT_DIR", "out"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--weights-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    events = EventLog(args.out)  # before anything is loaded: a crashing start leaves one too
    ckpt = os.path.join(args.out, "model.pt")

    data = random.Random(1234)
    X = [[data.uniform(-1, 1) for _ in range(4)] for _ in range(320)]
    Y = [2 * x[0] - 3 * x[1] + 0.5 * x[2] - x[3] + 1 + data.gauss(0, 0.1) for x in X]
    train, test = list(range(256)), list(range(256, 320))

    w, b, vw, vb, step, best = [0.0] * 4, 0.0, [0.0] * 4, 0.0, 0, float("inf")
    if args.resume:
        if not os.path.exists(ckpt):
            raise FileNotFoundError(f"--resume: no model.pt in {args.out}")
        with open(ckpt, "rb") as f:
            saved = pickle.load(f)
        if args.weights_only:
            w, b = saved["w"], saved["b"]
        else:
            w, b, step, best = saved["w"], saved["b"], saved["step"], saved["best"]
        print(f"loaded {ckpt} (step {step})", flush=True)
    rng = random.Random(42)  # the batch order is not saved: research style

    def predict(i: int) -> float:
        return sum(wi * xi for wi, xi in zip(w, X[i], strict=True)) + b

    def loss_on(idx: list[int]) -> float:
        return sum((predict(i) - Y[i]) ** 2 for i in idx) / len(idx)

    with open(os.path.join(args.out, "log.csv"), "a") as log:
        while step < STEPS:
            idx = [rng.choice(train) for _ in range(BATCH)]
            err = [predict(i) - Y[i] for i in idx]
            loss = sum(e * e for e in err) / BATCH
            pairs = list(zip(err, idx, strict=True))
            gw = [2 * sum(e * X[i][j] for e, i in pairs) / BATCH for j in range(4)]
            gb = 2 * sum(err) / BATCH
            vw = [MOMENTUM * v + g for v, g in zip(vw, gw, strict=True)]
            vb = MOMENTUM * vb + gb
            w = [wi - LR * v for wi, v in zip(w, vw, strict=True)]
            b -= LR * vb
            step += 1
            print(f"step {step} | loss {loss!r}", flush=True)
            events.scalar("train/loss", step, loss)
            log.write(f"{step},{loss!r}\n")
            log.flush()
            if step % EVAL_EVERY == 0:
                test_loss = loss_on(test)
                events.scalar("test/loss", step, test_loss)
                os.makedirs(os.path.join(args.out, "samples"), exist_ok=True)
                with open(os.path.join(args.out, "samples", f"step-{step}.txt"), "w") as sample:
                    sample.write(f"w={w} b={b}\n")
                if test_loss < best:  # saved only when it improves, over the one copy
                    best = test_loss
                    state = {"w": w, "b": b} if args.weights_only else {}
                    state = state or {"w": w, "b": b, "step": step, "best": best}
                    with open(ckpt, "wb") as out:
                        pickle.dump(state, out, protocol=4)
            time.sleep(STEP_SECONDS)


if __name__ == "__main__":
    main()

"""A correct script whose checkpoints come late and at irregular steps (drill plan tests).

60 steps; a checkpoint only after steps 36, 44 and 53 (the way a script that saves on a
schedule of its own, or when a metric improves, does), written atomically (a temp file,
then os.replace) with the whole state: weights, momentum, step and the RNG. It resumes by
itself from the checkpoint when one exists. Prints `{"step": N, "loss": X}` lines.

    CRASHDRILL_CKPT_DIR=/tmp/d python plan_late_ckpt.py
"""

import json
import os
import random
import time

ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
CKPT = os.path.join(ROOT, "state.json")
STEPS, SAVE_AFTER = 60, (36, 44, 53)

rng = random.Random(11)
w, m, step = 0.0, 0.0, 0
if os.path.exists(CKPT):
    with open(CKPT) as f:
        s = json.load(f)
    w, m, step = s["w"], s["m"], s["step"]
    rng.setstate((s["rng"][0], tuple(s["rng"][1]), s["rng"][2]))

while step < STEPS:
    x = rng.uniform(-1, 1)
    err = w * x - 2.5 * x
    loss = err * err
    m = 0.9 * m + 2 * err * x
    w -= 0.05 * m
    step += 1
    print(json.dumps({"step": step, "loss": loss}), flush=True)
    if step in SAVE_AFTER:
        with open(CKPT + ".tmp", "w") as f:
            json.dump({"w": w, "m": m, "step": step, "rng": rng.getstate()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(CKPT + ".tmp", CKPT)
    time.sleep(0.02)

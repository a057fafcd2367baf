"""A script whose one checkpoint file is rewritten in place, slowly (drill plan tests).

240 steps; after every 40th step it rewrites `ckpt.json` in place (open "w", written in
pieces as a large model's torch.save would be), so a kill inside that write leaves it
torn and the restart crashes on it; everything else resumes exactly (weights, momentum,
step, RNG). It resumes by itself from `ckpt.json` when it exists. PLAN_STEP_S sets the
seconds per step (default 0.01).

    CRASHDRILL_CKPT_DIR=/tmp/d python plan_torn_inplace.py
"""

import json
import os
import random
import time

CKPT = os.path.join(os.environ["CRASHDRILL_CKPT_DIR"], "ckpt.json")
STEPS, EVERY = 240, 40
STEP_S = float(os.environ.get("PLAN_STEP_S", "0.01"))

rng = random.Random(5)
w, m, step = 0.0, 0.0, 0
if os.path.exists(CKPT):
    with open(CKPT) as f:
        s = json.load(f)  # a torn file: json.decoder.JSONDecodeError
    w, m, step = s["w"], s["m"], s["step"]
    rng.setstate((s["rng"][0], tuple(s["rng"][1]), s["rng"][2]))

while step < STEPS:
    x = rng.uniform(-1, 1)
    err = w * x + 1.5 * x
    loss = err * err
    m = 0.9 * m + 2 * err * x
    w -= 0.05 * m
    step += 1
    print(json.dumps({"step": step, "loss": loss}), flush=True)
    if step % EVERY == 0:
        text = json.dumps({"w": w, "m": m, "step": step, "rng": rng.getstate(), "pad": "x" * 4000})
        with open(CKPT, "w") as f:  # in place: not a temp file and a rename
            for i in range(8):
                f.write(text[i * len(text) // 8 : (i + 1) * len(text) // 8])
                f.flush()
                time.sleep(0.02)
    time.sleep(STEP_S)

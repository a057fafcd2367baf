"""Independent trials: one bug must not hide another (issue #26, items 1 and 2).

Two small scripts this file writes itself, each with the bugs of a real trainer that the
drill used to report only in part:

- NANO, shaped like Karpathy's nanoGPT `train.py`: its checkpoint `ckpt.pt` is rewritten
  in place at the top of every eval interval (a pickle, like `torch.save(path)`), it
  prints `iter N: loss X.XXXX` (4 decimals), and `get_batch` draws from the global RNG,
  which is seeded at the start and never restored (`--init_from=resume` reloads the
  weights, the optimizer and `iter_num` only). Three bugs, all named in one run with the
  default 2 kills.
- TRAINER, shaped like a Hugging Face `Trainer` script: it writes `checkpoint-N/` in
  place and slowly (the weights take most of the time), so a kill aimed at a write tears
  it and the restart fails; everything else resumes exactly. The plain resume must
  still be judged, and pass.

Real processes, real SIGKILL; pure Python, each script runs for about 1.5 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

NANO = '''\
"""nanoGPT-shaped: in-place checkpoint, 4 decimals, global RNG not restored."""
import os, pickle, random, sys, time

out_dir = os.environ["CRASHDRILL_CKPT_DIR"]
init_from = "resume" if "--init_from=resume" in sys.argv else "scratch"
max_iters, eval_interval, batch_size, lr, beta = 40, 10, 8, 0.05, 0.9
random.seed(1337)  # seeded at every start, never saved: the resume draws other batches

data = random.Random(7)
X = [[data.uniform(-1, 1) for _ in range(3)] for _ in range(256)]
Y = [2 * x[0] - 3 * x[1] + 0.5 * x[2] + 1 + data.gauss(0, 0.1) for x in X]


def get_batch():
    return [random.randrange(len(X)) for _ in range(batch_size)]


iter_num, w, b, mw, mb = 0, [0.0, 0.0, 0.0], 0.0, [0.0, 0.0, 0.0], 0.0
if init_from == "resume":
    with open(os.path.join(out_dir, "ckpt.pt"), "rb") as f:
        ckpt = pickle.load(f)
    iter_num, w, b, mw, mb = ckpt["iter_num"], ckpt["w"], ckpt["b"], ckpt["mw"], ckpt["mb"]

while True:
    if iter_num % eval_interval == 0 and iter_num > 0:
        ckpt = {"iter_num": iter_num, "w": w, "b": b, "mw": mw, "mb": mb, "pad": "x" * 4000}
        blob = pickle.dumps(ckpt)
        with open(os.path.join(out_dir, "ckpt.pt"), "wb") as f:  # in place, like torch.save
            for i in range(5):  # a real model takes a while to write
                f.write(blob[i * len(blob) // 5 : (i + 1) * len(blob) // 5])
                f.flush()
                time.sleep(0.03)
    idx = get_batch()
    err = [sum(wi * xi for wi, xi in zip(w, X[i])) + b - Y[i] for i in idx]
    loss = sum(e * e for e in err) / batch_size
    gw = [2 * sum(e * X[i][j] for e, i in zip(err, idx)) / batch_size for j in range(3)]
    gb = 2 * sum(err) / batch_size
    mw = [beta * m + g for m, g in zip(mw, gw)]
    mb = beta * mb + gb
    w = [wi - lr * m for wi, m in zip(w, mw)]
    b -= lr * mb
    print(f"iter {iter_num}: loss {loss:.4f}", flush=True)
    iter_num += 1
    if iter_num > max_iters:
        break
    time.sleep(0.02)
'''

TRAINER = '''\
"""Trainer-shaped: checkpoint-N/ written in place and slowly; a correct resume otherwise."""
import json, os, random, sys, time

ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
STEPS, SAVE_STEPS = 24, 4
rng = random.Random(42)
w, step = 0.0, 0
if "--resume_from_checkpoint" in sys.argv:
    found = [d for d in os.listdir(ROOT) if d.startswith("checkpoint-")]
    last = max(found, key=lambda d: int(d.split("-")[1]))  # like get_last_checkpoint
    state = os.path.join(ROOT, last, "trainer_state.json")
    if not os.path.exists(state):  # what Trainer says of a checkpoint dir missing its files
        raise ValueError(f"Can't find a valid checkpoint at {os.path.join(ROOT, last)}")
    with open(state) as f:
        s = json.load(f)
    step, w = s["step"], s["w"]
    rng.setstate((s["rng"][0], tuple(s["rng"][1]), s["rng"][2]))

while step < STEPS:
    x = rng.uniform(-1, 1)
    loss = (w * x - 3 * x) ** 2
    w -= 0.1 * 2 * (w * x - 3 * x) * x
    step += 1
    print(json.dumps({"step": step, "loss": loss}), flush=True)
    if step % SAVE_STEPS == 0:
        d = os.path.join(ROOT, f"checkpoint-{step}")
        os.makedirs(d)  # under its final name from the start: not atomic
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write("{}")
        time.sleep(0.25)  # model.safetensors: most of the write's time
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump({"step": step, "w": w, "rng": rng.getstate()}, f)
    time.sleep(0.02)
'''

NANO_REGEX = r"iter (?P<step>\d+): loss (?P<loss>\S+)"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scripts")
    (root / "nano_train.py").write_text(NANO)
    (root / "trainer_train.py").write_text(TRAINER)
    return {"nano": root / "nano_train.py", "trainer": root / "trainer_train.py"}


def verify(script: Path, tmp_path: Path, *opts: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(out), *opts]
    cmd += ["--", sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=140)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def failing(report: dict[str, Any]) -> set[str]:
    return {d["code"] for d in report["diagnosis"] if d["fails"]}


@pytest.mark.parametrize("seed", [1, 5])
def test_nanogpt_s_three_bugs_are_all_named_in_one_run_with_the_default_kills(
    scripts: dict[str, Path], tmp_path: Path, seed: int
) -> None:
    opts = ("--seed", str(seed), "--loss-regex", NANO_REGEX, "--resume-args=--init_from=resume")
    rc, rep, out = verify(scripts["nano"], tmp_path, *opts)
    assert rc == 1 and rep["kills_requested"] == 2, out
    assert {"torn-checkpoint", "too-few-digits", "state-missing"} <= failing(rep), out
    torn = next(d for d in rep["diagnosis"] if d["code"] == "torn-checkpoint")
    assert "ckpt.pt" in torn["text"] and "in place" in torn["text"], out
    assert any("failed to load" in e for e in torn["evidence"]), torn
    missing = next(d for d in rep["diagnosis"] if d["code"] == "state-missing")
    assert "RNG state" in missing["text"], out
    kinds = {t["kind"]: t for t in rep["trials"]}
    assert not kinds["inside-write"]["passed"] and not kinds["after-checkpoint"]["passed"], out
    # the plain resume came from a copy of the state before the torn write
    assert any(k["recovery"] and k["landed"] for k in rep["kills"]), out
    assert any(r["replay_of"] is not None for r in rep["resumes"]), out


def test_a_trainer_whose_write_kills_tear_still_gets_its_plain_resume_judged(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    rc, rep, out = verify(
        scripts["trainer"], tmp_path, "--seed", "2", "--resume-args=--resume_from_checkpoint"
    )
    assert rc == 1 and failing(rep) == {"torn-checkpoint"}, out
    torn = next(d for d in rep["diagnosis"] if d["code"] == "torn-checkpoint")
    assert "checkpoint-" in torn["text"] and "Can't find a valid checkpoint" in torn["text"]
    kinds = {t["kind"]: t for t in rep["trials"]}
    assert not kinds["inside-write"]["passed"], out
    plain = kinds["after-checkpoint"]
    assert plain["passed"], out
    judged = [r for r in rep["resumes"] if r["index"] in plain["resumes"]]
    assert judged and all(r["bit_identical"] and r["points"] > 0 for r in judged), out
    assert "trials:" in out and "after a complete checkpoint" in out

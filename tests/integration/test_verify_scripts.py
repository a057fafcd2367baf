"""`crashdrill verify -- COMMAND` on small training scripts that this file writes itself:
one correct, the others each broken in one way the drill must name. Real processes, real
SIGKILL. Each script trains for about 1.5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOY = '''\
"""Linear regression with SGD + momentum on random minibatches; a JSON checkpoint in
$CRASHDRILL_CKPT_DIR every 8 steps, written slowly (like a big one). argv[1]: a flaw."""
import json, os, random, sys, time

FLAW = sys.argv[1] if len(sys.argv) > 1 else "none"
STEPS, EVERY, BATCH, LR, MOMENTUM = 40, 8, 8, 0.05, 0.9
ROOT = os.environ["CRASHDRILL_CKPT_DIR"]
CKPT = os.path.join(ROOT, "ckpt.json")
if FLAW == "dirtorn":  # dirtorn: checkpoint-N/ written in place, the latest one loaded
    found = sorted(d for d in os.listdir(ROOT) if d.startswith("checkpoint-"))
    CKPT = os.path.join(ROOT, found[-1] if found else "checkpoint-none", "state.json")
    if found and not os.path.exists(CKPT):  # what get_last_checkpoint + load would say
        raise ValueError(f"Can't find a valid checkpoint at {os.path.dirname(CKPT)}")
if "--resume" in sys.argv and not os.path.exists(CKPT):  # like init_from="resume"
    raise FileNotFoundError(f"--resume: no checkpoint in {ROOT}")

data = random.Random(1234)
X = [[data.uniform(-1, 1) for _ in range(3)] for _ in range(256)]
Y = [2 * x[0] - 3 * x[1] + 0.5 * x[2] + 1 + data.gauss(0, 0.1) for x in X]

w, b, vw, vb, step = [0.0, 0.0, 0.0], 0.0, [0.0, 0.0, 0.0], 0.0, 0
rng = random.Random(42)
if os.path.exists(CKPT) and FLAW != "fresh":          # fresh: never loads it
    if FLAW == "crash":
        raise RuntimeError(f"cannot load {CKPT}: unsupported format")
    if FLAW == "hang":
        time.sleep(3600)
    with open(CKPT) as f:
        s = json.load(f)
    step, w, b = s["step"], s["w"], s["b"]
    if FLAW != "optimizer":                            # optimizer: momentum not restored
        vw, vb = s["vw"], s["vb"]
    if FLAW != "rng":                                  # rng: the batch stream starts over
        rng.setstate((s["rng"][0], tuple(s["rng"][1]), s["rng"][2]))
ONCE = os.path.join(os.path.dirname(ROOT), "crashed-once")  # beside both runs' dirs
CRASH_AFTER_SAVE = FLAW == "crashonce" and step > 0 and not os.path.exists(ONCE)


def save():
    global CKPT
    text = json.dumps({"step": step, "w": w, "b": b, "vw": vw, "vb": vb, "rng": rng.getstate()})
    if FLAW == "dirtorn":
        os.makedirs(os.path.join(ROOT, f"checkpoint-{step:04d}"))
        CKPT = os.path.join(ROOT, f"checkpoint-{step:04d}", "state.json")
        with open(os.path.join(os.path.dirname(CKPT), "config.json"), "w") as f:
            f.write("{}")
        time.sleep(0.3)  # the weights take a while: a kill lands in the dir's write
    path = CKPT if FLAW in ("inplace", "dirtorn") else CKPT + ".tmp"  # in place: torn by a kill
    with open(path, "w") as f:
        for i in range(5):
            f.write(text[i * len(text) // 5 : (i + 1) * len(text) // 5])
            f.flush()
            time.sleep(0.02)
        os.fsync(f.fileno())
    if path != CKPT:
        os.replace(path, CKPT)


while step < STEPS:
    idx = [rng.randrange(len(X)) for _ in range(BATCH)]
    err = [sum(wi * xi for wi, xi in zip(w, X[i])) + b - Y[i] for i in idx]
    loss = sum(e * e for e in err) / BATCH
    if FLAW == "unseeded":
        loss += random.SystemRandom().random() * 1e-9
    gw = [2 * sum(e * X[i][j] for e, i in zip(err, idx)) / BATCH for j in range(3)]
    gb = 2 * sum(err) / BATCH
    vw = [MOMENTUM * v + g for v, g in zip(vw, gw)]
    vb = MOMENTUM * vb + gb
    w = [wi - LR * v for wi, v in zip(w, vw)]
    b -= LR * vb
    step += 1
    if FLAW == "digits":
        print(f"iter {step}: loss {loss:.4f}", flush=True)
    elif FLAW == "pipe":
        print(f"step {step} | loss {loss!r}", flush=True)
    elif FLAW == "unreadable":  # a shape the drill does not know: --loss-regex needed
        print(f"it={step} L={loss!r}", flush=True)
    else:
        print(json.dumps({"step": step, "loss": loss}), flush=True)
    if FLAW != "never" and step % EVERY == 0:
        save()
        if CRASH_AFTER_SAVE:  # crashonce: the first resume crashes after its next save
            open(ONCE, "w").close()
            raise RuntimeError(f"resumed state broke at step {step}")
    time.sleep(0.03)
'''

ITER_REGEX = r"iter (?P<step>\d+): loss (?P<loss>\S+)"


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "toy_train.py"
    path.write_text(TOY)
    return path


def verify(toy: Path, tmp_path: Path, flaw: str, *opts: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(out), *opts]
    cmd += ["--", sys.executable, str(toy), flaw]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def codes(report: dict[str, Any]) -> list[str]:
    return [d["code"] for d in report["diagnosis"] if d["fails"]]


@pytest.mark.parametrize(("seed", "kills"), [(1, 2), (2, 3), (5, 2)])
def test_a_correct_script_passes(toy: Path, tmp_path: Path, seed: int, kills: int) -> None:
    rc, rep, out = verify(toy, tmp_path, "none", "--seed", str(seed), "--kills", str(kills))
    assert rc == 0, out
    assert rep["verdict"] == "pass" and len(rep["resumes"]) == kills
    assert all(r["bit_identical"] for r in rep["resumes"])
    assert any(k["in_checkpoint_write"] for k in rep["kills"])
    assert rep["kills"][0]["planned_step"] < 8  # before the first checkpoint
    assert "PASS" in out


def test_the_same_seed_replays_the_same_kills(toy: Path, tmp_path: Path) -> None:
    _, a, _ = verify(toy, tmp_path, "none", "--seed", "11", "--kills", "3")
    _, b, _ = verify(toy, tmp_path, "none", "--seed", "11", "--kills", "3")
    # The first checkpoint's step is observed from the reference: on a busy machine it can
    # read a step early, which moves a kill by at most one step.
    for ka, kb in zip(a["kills"], b["kills"], strict=True):
        assert ka["during_write"] == kb["during_write"]
        assert abs(ka["planned_step"] - kb["planned_step"]) <= 1


def test_rng_saved_but_not_restored_diverges_at_the_first_recomputed_step(
    toy: Path, tmp_path: Path
) -> None:
    # The JSON checkpoint holds random.getstate() (recognised by its 625 ints); the "rng"
    # flaw is a restart that does not call setstate with it
    rc, rep, out = verify(toy, tmp_path, "rng", "--seed", "1")
    assert rc == 1 and codes(rep) == ["saved-not-restored"], out
    bad = [r for r in rep["resumes"] if not r["bit_identical"]]
    assert bad and bad[0]["first_divergent_step"] == bad[0]["first_step"]
    text = rep["diagnosis"][0]["text"]
    assert "saved but not restored" in text and "finds RNG states (" in text, text


def test_optimizer_not_saved_diverges_one_step_later(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "optimizer", "--seed", "1")
    assert rc == 1 and codes(rep) == ["state-missing"], out
    bad = [r for r in rep["resumes"] if not r["bit_identical"]]
    assert bad and bad[0]["first_divergent_step"] == bad[0]["first_step"] + 1
    assert "optimizer state" in rep["diagnosis"][0]["text"]


def test_ignoring_the_checkpoint_is_a_silent_fresh_start(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "fresh", "--seed", "1")
    assert rc == 1 and codes(rep) == ["silent-fresh-start"], out
    assert any(r["restarted_from_start"] and r["checkpoint_existed"] for r in rep["resumes"])


def test_never_checkpointing_loses_everything(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "never", "--seed", "1")
    assert rc == 1 and codes(rep) == ["never-checkpoints"], out
    assert all(r["restarted_from_start"] for r in rep["resumes"]) and rep["resumes"]
    assert all(r["from_step"] is None for r in rep["resumes"])  # from nothing, not step -1


def test_an_in_place_write_killed_mid_write_is_a_torn_checkpoint(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "inplace", "--seed", "1")
    assert rc == 1 and codes(rep) == ["torn-checkpoint"], out
    text = rep["diagnosis"][0]["text"]
    assert "ckpt.json" in text and "in place" in text and "JSONDecodeError" in text


def test_too_few_digits_cannot_prove_bit_identity(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "digits", "--seed", "1", "--loss-regex", ITER_REGEX)
    assert rc == 1 and codes(rep) == ["too-few-digits"], out
    assert rep["precision"] == {
        "kind": "rounded",
        "digits": 5,
        "exact": False,
        "text": rep["precision"]["text"],
    }
    assert all(r["verdict"] == "equal at 5 digits" for r in rep["resumes"])


def test_a_regex_reads_pipe_lines_at_full_precision(toy: Path, tmp_path: Path) -> None:
    regex = r"step (?P<step>\d+) \| loss (?P<loss>\S+)"
    rc, rep, out = verify(toy, tmp_path, "pipe", "--seed", "3", "--loss-regex", regex)
    assert rc == 0 and rep["precision"]["exact"], out


def test_an_unseeded_script_is_nondeterministic(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "unseeded", "--seed", "1")
    assert rc == 1 and codes(rep) == ["nondeterministic"], out
    assert "before any kill" in rep["diagnosis"][0]["text"]


def test_a_script_that_crashes_on_resume_shows_its_stderr(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "crash", "--seed", "1")
    assert rc == 1 and codes(rep) == ["crashed"], out
    assert "unsupported format" in rep["diagnosis"][0]["text"]


def test_a_script_that_hangs_on_resume_times_out(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "hang", "--seed", "1", "--timeout", "4")
    assert rc == 1 and codes(rep) == ["hung"], out


def test_after_a_restart_that_crashed_having_saved_the_next_kills_still_count(
    toy: Path, tmp_path: Path
) -> None:
    rc, rep, out = verify(toy, tmp_path, "crashonce", "--seed", "1", "--kills", "3")
    assert rc == 1 and codes(rep) == ["crashed"], out
    outcomes = [r["outcome"] for r in rep["resumes"]]
    assert "crashed (exit 1)" in outcomes and outcomes[-1] == "finished", outcomes
    crashed = outcomes.index("crashed (exit 1)")
    assert rep["resumes"][crashed + 1]["bit_identical"]  # resumed from what it saved
    assert "resumed state broke" in rep["diagnosis"][0]["text"]


def test_steps_the_parser_cannot_read_are_bad_input(toy: Path, tmp_path: Path) -> None:
    rc, rep, out = verify(toy, tmp_path, "unreadable", "--seed", "1")  # no --loss-regex
    assert rc == 2 and codes(rep) == ["no-steps"], out
    text = rep["diagnosis"][0]["text"]
    assert "it=1 L=" in text and "none of the loss-line shapes matched" in text
    assert "iter 120: loss 2.3411" in text  # the shapes it tried
    rc, rep, _ = verify(
        toy, tmp_path, "unreadable", "--seed", "1", "--kills", "0",
        "--loss-regex", r"it=(?P<step>\d+) L=(?P<loss>\S+)",
    )  # fmt: skip
    assert rc == 0 and rep["target"]["loss_lines"] == "regex"


def test_iter_lines_are_read_with_no_loss_regex_and_their_rounding_is_named(
    toy: Path, tmp_path: Path
) -> None:
    rc, rep, out = verify(toy, tmp_path, "digits", "--seed", "1")
    assert rc == 1 and codes(rep) == ["too-few-digits"], out
    assert rep["target"]["loss_lines"] == "nanogpt" and "loss lines: nanoGPT" in out


def test_resume_args_are_appended_on_restarts_only(toy: Path, tmp_path: Path) -> None:
    wrapper = tmp_path / "wrapper.py"
    log = tmp_path / "argv.log"
    wrapper.write_text(
        "import os, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"os.execv(sys.executable, [sys.executable, {str(toy)!r}, 'none'])\n"
    )
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--seed", "1", "--json", str(out)]
    cmd += ["--resume-args=--resume --from {ckpt_dir}", "--", sys.executable, str(wrapper), "a"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "a" and calls[1] == "a"  # reference, then the crashed run's first start
    assert calls[2] == "a"  # the first kill lands before the first checkpoint: nothing to resume
    assert calls[3].startswith("a --resume --from ") and "crashed" in calls[3]
    assert len(calls) == 4
    assert [r["resume_args"] for r in json.loads(out.read_text())["resumes"]] == [False, True]


def test_resume_args_wait_until_the_checkpoint_dir_holds_something(
    toy: Path, tmp_path: Path
) -> None:
    rc, rep, out = verify(toy, tmp_path, "none", "--seed", "1", "--resume-args=--resume")
    assert rc == 0, out
    assert [r["resume_args"] for r in rep["resumes"]] == [False, True]
    assert rep["resumes"][0]["from_step"] is None and rep["resumes"][1]["from_step"] >= 8
    assert "resume args: given to restart(s) 2; not to 1" in out


def test_resume_args_always_crashes_a_script_told_to_resume_from_nothing(
    toy: Path, tmp_path: Path
) -> None:
    opts = ("--seed", "1", "--resume-args=--resume", "--resume-args-always")
    rc, rep, out = verify(toy, tmp_path, "none", *opts)
    assert rc == 1 and codes(rep) == ["crashed"], out
    assert rep["resumes"][0]["resume_args"] is True
    assert "--resume: no checkpoint in" in rep["diagnosis"][0]["text"]


def test_a_checkpoint_dir_left_incomplete_by_a_kill_is_a_torn_checkpoint(
    toy: Path, tmp_path: Path
) -> None:
    rc, rep, out = verify(toy, tmp_path, "dirtorn", "--seed", "1")
    assert rc == 1 and codes(rep) == ["torn-checkpoint"], out
    text = rep["diagnosis"][0]["text"]
    assert "checkpoint-00" in text and "incomplete under its final name" in text, text
    assert "rename it when complete" in text and "skip a checkpoint that is incomplete" in text
    assert any(k["in_checkpoint_write"] for k in rep["kills"])

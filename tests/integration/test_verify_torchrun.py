"""`crashdrill verify -- torchrun --nproc_per_node 2 …` on a 2-rank DDP script (gloo, CPU)
that this file writes itself: a kill takes down the launcher and both ranks (they run in
their own sessions), a correct script passes bit-identically, one whose ranks do not
restore their own RNG fails naming it, and no process of the drill is left alive.
Each drill starts torchrun four times (~5 s each on an idle machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TORCHRUN = Path(sys.executable).with_name("torchrun")

DDP = '''"""2-rank DDP (gloo, CPU): each rank draws its own batches from its own generator; rank 0
prints the all-reduced loss. A checkpoint dir step-N/ every 5 steps, built as tmp-step-N/
and renamed when complete. argv[1]: "none" or "rng" (a rank restores rank 0's generator)."""
import json, os, shutil, sys, time
import torch
import torch.distributed as dist

FLAW = sys.argv[1] if len(sys.argv) > 1 else "none"
STEPS, EVERY = 24, 5
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
root = os.environ["CRASHDRILL_CKPT_DIR"]
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(1000 + rank)
true_w = torch.arange(8, dtype=torch.float32) / 8
step = 0
done = sorted(int(d[5:]) for d in os.listdir(root) if d.startswith("step-"))
if done:
    path = os.path.join(root, f"step-{done[-1]}")
    state = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]
    own = 0 if FLAW == "rng" else rank  # rng: every rank takes rank 0's stream
    gen.set_state(torch.load(os.path.join(path, f"rng-{own}.pt"), weights_only=True))
    if rank == 0:
        print(f"resumed at step {step} from {path}", file=sys.stderr, flush=True)


def save():
    tmp, final = os.path.join(root, f"tmp-step-{step}"), os.path.join(root, f"step-{step}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a kill inside an earlier write
        os.makedirs(tmp)
    dist.barrier()
    torch.save(gen.get_state(), os.path.join(tmp, f"rng-{rank}.pt"))
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                   os.path.join(tmp, "state.pt"))
    dist.barrier()
    if rank == 0:
        time.sleep(0.05)  # a write that takes a while, so a kill can land in it
        os.replace(tmp, final)
    dist.barrier()


while step < STEPS:
    x = torch.randn(16, 8, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(16, generator=gen)
    loss = ((ddp(x).squeeze(1) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    # Both ranks print (the drill reads rank 0's), each line in one write: print() writes
    # the text and its newline separately, and two ranks' lines would interleave.
    bits = int(mean.view(torch.int32).item()) & 0xFFFFFFFF
    line = {"step": step, "loss": mean.item(), "rank": rank, "loss_bits": bits}
    sys.stdout.write(json.dumps(line) + "\\n")
    sys.stdout.flush()
    if step % EVERY == 0:
        save()
    time.sleep(0.02)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def ddp_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not TORCHRUN.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not installed")
    path = tmp_path_factory.mktemp("ddp") / "ddp_train.py"
    path.write_text(DDP)
    return path


def _ours(script: Path) -> list[psutil.Process]:
    """Live processes running the script (the ranks) or torchrun on it."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(script) in " ".join(
                p.info["cmdline"] or []
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def drill(script: Path, tmp_path: Path, flaw: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    torchrun = str(TORCHRUN) if TORCHRUN.exists() else "torchrun"
    cmd = [sys.executable, "-m", "crashdrill.drill", "--json", str(out), "--seed", "3"]
    cmd += ["--kills", "2", "--timeout", "120", "--"]
    cmd += [torchrun, "--standalone", "--nproc_per_node", "2", str(script), flaw]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=230)
    assert out.is_file(), f"no report; exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def test_a_correct_ddp_script_under_torchrun_passes_and_every_kill_takes_down_all_ranks(
    ddp_script: Path, tmp_path: Path
) -> None:
    rc, rep, out = drill(ddp_script, tmp_path, "none")
    assert rc == 0, out
    assert len(rep["resumes"]) == 2 and all(r["bit_identical"] for r in rep["resumes"])
    assert rep["precision"]["kind"] == "bits"  # rank 0's lines; rank 1's were left out
    assert rep["reference"]["points"] == 24
    # torchrun and its two ranks, each rank in a session of its own
    assert all(k["landed"] and k["processes"] >= 3 for k in rep["kills"]), rep["kills"]
    assert "3 processes" in out
    assert _ours(ddp_script) == []


def test_ranks_that_do_not_restore_their_own_rng_fail_naming_it(
    ddp_script: Path, tmp_path: Path
) -> None:
    rc, rep, out = drill(ddp_script, tmp_path, "rng")
    assert rc == 1, out
    codes = [d["code"] for d in rep["diagnosis"] if d["fails"]]
    # Every rank saves its own generator (rng-R.pt) and rank 1 loads rank 0's: the state is
    # in the checkpoint, so the drill says saved but not restored, not "lacks".
    assert codes == ["saved-not-restored"], out
    assert "RNG state" in rep["diagnosis"][0]["text"]
    bad = [r for r in rep["resumes"] if not r["bit_identical"]]
    assert bad and bad[0]["first_divergent_step"] == bad[0]["first_step"]
    assert _ours(ddp_script) == []

"""CUDA determinism and bf16: skipped cleanly on machines without CUDA."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import torch

from crashdrill.trainer.checkpoint import load_model_state
from tests.conftest import crashdrill_cmd, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
ARGS = ["run", "quick", "--jsonl", "--quiet", "--set", "device=cuda"]


def _bits(stdout: str) -> dict[int, int]:
    return {r["step"]: r["loss_bits"] for r in map(json.loads, stdout.splitlines())}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_run_is_reproducible_and_resumes_bit_identical(tmp_path, precision):
    extra = ["--set", f"precision={precision}"]
    a = _bits(run_cli(*ARGS, *extra, "--run-dir", str(tmp_path / "a"), check=True).stdout)
    b = _bits(run_cli(*ARGS, *extra, "--run-dir", str(tmp_path / "b"), check=True).stdout)
    assert a == b, "two uninterrupted CUDA runs differ: a nondeterministic kernel"
    crashed = tmp_path / "c"
    proc = subprocess.Popen(
        crashdrill_cmd(*ARGS, *extra, "--run-dir", str(crashed)), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["step"] >= 170:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    rest = run_cli(*ARGS, *extra, "--run-dir", str(crashed), "--require-checkpoint", check=True)
    resumed = _bits(rest.stdout)
    assert min(resumed) == 151
    assert all(a[s] == bits for s, bits in resumed.items())
    pa, pc = load_model_state(tmp_path / "a"), load_model_state(crashed)
    assert all(torch.equal(pa[k], pc[k]) for k in pa)

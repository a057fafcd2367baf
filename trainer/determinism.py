"""Everything that makes two processes compute the same bits, and the RNG state that a
checkpoint must carry for a resumed process to continue the same stream.

Restore, never re-seed: a resumed process that calls manual_seed(seed) at startup replays
the random stream from the beginning — the loss looks fine and the run is not the same.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any

import numpy as np
import torch


def configure(threads: int, device: torch.device) -> None:
    """Fix the thread count (it changes reduction order, hence bits) and ask for
    deterministic kernels. Call before any tensor work."""
    if device.type == "cuda":
        # cuBLAS needs a fixed workspace to be deterministic; must be set before init.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(threads)
    # raises when already set in this process (e.g. a test that trains twice)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    if device.type == "cuda":
        torch.use_deterministic_algorithms(True)
    else:
        # The public call also flips an inductor setting, importing the whole compiler
        # stack (~1.5 s per process start). We never compile on CPU, so set the one flag
        # that matters for eager kernels directly.
        torch._C._set_deterministic_algorithms(True)


def seed_all(seed: int) -> None:
    """Only for a fresh start. A resume restores state with `set_rng_state` instead."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """Every global RNG stream, as tensors and ints (loadable with weights_only=True)."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": torch.tensor(mt, dtype=torch.int64),
            "gauss": gauss if gauss is None else float(gauss),
        },
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state(
        (
            nps["name"],
            nps["keys"].numpy().astype(np.uint32),
            nps["pos"],
            nps["has_gauss"],
            nps["gauss"],
        )
    )
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])

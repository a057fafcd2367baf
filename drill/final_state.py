"""The final weights of both runs of a preset drill, tensor by tensor, with torch.equal.

    python -m crashdrill.drill.final_state REF_DIR CRASHED_DIR    # the result as one JSON line

With a fork server the drill runs this in a process forked from it (torch is imported
there already) instead of importing torch, ~1.5 s of CPU, in the drill itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from crashdrill.drill.target import Child
from crashdrill.drill.verdicts import FinalParams
from crashdrill.processes.forkserver import ForkServer

METHOD = "torch.equal"


def compare_final_params(ref_dir: Path, crash_dir: Path) -> FinalParams:
    """In this process: the weights of both runs' final checkpoints."""
    try:
        import torch

        from crashdrill.trainer.checkpoint import load_model_state

        a, b = load_model_state(ref_dir), load_model_state(crash_dir)
    except Exception as e:  # a missing or corrupt final checkpoint is a finding
        return FinalParams(False, 0, [], f"could not load the final weights: {e}", METHOD)
    names = sorted(set(a) | set(b))
    bad = [n for n in names if n not in a or n not in b or not torch.equal(a[n], b[n])]
    return FinalParams(not bad, len(names), bad, None, METHOD)


def compare_final_params_forked(
    server: ForkServer, ref_dir: Path, crash_dir: Path, env: dict[str, str], timeout: float
) -> FinalParams:
    """The same comparison in a process forked from `server` (ForkServerError when the
    server is gone), given `timeout` seconds."""
    argv = [sys.executable, "-m", __name__, str(ref_dir), str(crash_dir)]
    child = server.spawn_piped(argv, env, None)
    out, err = _communicate(child, timeout)
    if child.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
    code = child.wait()
    try:
        return FinalParams(**json.loads(out))
    except (ValueError, TypeError):
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return FinalParams(False, 0, [], f"the comparison exited {code}: {tail[0]}", METHOD)


def _communicate(child: Child, timeout: float) -> tuple[bytes, bytes]:
    """Both pipes to their end (or the deadline), read together so neither fills up."""
    chunks: dict[int, list[bytes]] = {child.stdout.fileno(): [], child.stderr.fileno(): []}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for stream in (child.stdout, child.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fileobj)
    out, err = (b"".join(chunks[s.fileno()]) for s in (child.stdout, child.stderr))
    child.stdout.close()
    child.stderr.close()
    return out, err


def main(argv: list[str]) -> None:
    ref_dir, crash_dir = argv
    print(json.dumps(asdict(compare_final_params(Path(ref_dir), Path(crash_dir)))), flush=True)
    # Nothing is left open: skip the interpreter's teardown, which with torch loaded takes
    # ~0.35 s of CPU (forked) and sits on the drill's critical path.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

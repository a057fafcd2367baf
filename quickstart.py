#!/usr/bin/env python3
"""Set up crashdrill in ./.venv and run it. Needs only Python ≥ 3.11.

    python3 quickstart.py lab     # set up, then the lab at http://127.0.0.1:8000
    python3 quickstart.py test    # set up with test tools, then the whole test suite
    python3 quickstart.py setup   # set up only (add --test for the test tools)

torch: on a machine with an NVIDIA GPU the regular (CUDA) build is installed. Without
one, a CPU build is taken instead of gigabytes of CUDA libraries: from a local wheel when
pip can find one, else from PyTorch's CPU index. Override with CRASHDRILL_TORCH_INDEX
(a pip index URL) or CRASHDRILL_TORCH="torch==X" for the requirement itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("CRASHDRILL_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
TORCH = os.environ.get("CRASHDRILL_TORCH", "torch==2.13.0")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def sh(*cmd: str | Path, check: bool = True, env: dict[str, str] | None = None) -> int:
    say("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=check, env=env, cwd=ROOT).returncode


def pip(*args: str, check: bool = True) -> int:
    return sh(PY, "-m", "pip", "install", "--disable-pip-version-check", *args, check=check)


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def torch_installed() -> bool:
    want = TORCH.split("==", 1)[1] if "==" in TORCH else None
    code = "import torch, sys; print(torch.__version__)"
    out = subprocess.run([str(PY), "-c", code], capture_output=True, text=True)
    return out.returncode == 0 and (want is None or out.stdout.strip().startswith(want))


def install_torch() -> None:
    if torch_installed():
        say(f"{TORCH} already installed")
        return
    index = os.environ.get("CRASHDRILL_TORCH_INDEX")
    if index:
        pip(TORCH, "--index-url", index)
    elif has_nvidia_gpu():
        say("NVIDIA GPU found: installing the CUDA build of torch")
        pip(TORCH)
    else:
        say("no NVIDIA GPU: installing a CPU build of torch")
        # A local wheel (pip's find-links) first: then torch's own dependencies come from
        # the regular index and torch is already satisfied, so nothing big is downloaded.
        if pip("--no-index", "--no-deps", TORCH, check=False) == 0:
            pip(TORCH)
        else:
            pip(TORCH, "--index-url", CPU_INDEX)  # that index also serves torch's dependencies


def setup(test: bool) -> None:
    if not PY.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    install_torch()
    # `ray` only for the tests (the Ray tier): the default lab needs no cluster.
    extras = "server,gpu,data,postgres,gcs,supabase,ray,test" if test else "server,gpu"
    pip("-e", f".[{extras}]")
    # front-end packages from npm (uPlot), never committed; without Node.js the page still
    # works and says that its charts are missing
    if sh(PY, "scripts/build_web.py", check=False) != 0:
        say("could not fetch uPlot from npm: the lab page will run without charts")
    if test:
        ensure_chromium()


def ensure_chromium() -> None:
    if Path("/usr/bin/chromium").exists() or os.environ.get("CRASHDRILL_SKIP_BROWSER"):
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        say("installing Debian's chromium for the browser tests")
        sh("apt-get", "update", "-qq", check=False)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh("apt-get", "install", "-y", "-qq", "chromium", check=False, env=env)
    if not Path("/usr/bin/chromium").exists():
        say("no /usr/bin/chromium: the browser tests will be skipped")


def run_tests() -> int:
    status = 0
    steps: list[list[str | Path]] = [
        [BIN / "ruff", "check", "."],
        [BIN / "ruff", "format", "--check", "."],
        [BIN / "mypy", "server", "workers", "drill"],
        [PY, "-m", "pytest", "tests", "-p", "no:cacheprovider"],
        [BIN / "crashdrill", "verify", "--preset", "quick", "--kills", "2"],
    ]
    for cmd in steps:
        rc = sh(*cmd, check=False)
        if rc != 0:
            say(f"FAILED ({rc}): {' '.join(str(c) for c in cmd)}")
            status = 1
    say("all checks passed" if status == 0 else "some checks failed")
    return status


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("lab", "test", "setup"):
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs before any venv exists
        print("crashdrill needs Python ≥ 3.11", file=sys.stderr)
        return 2
    cmd = argv[0]
    setup(test=cmd == "test" or "--test" in argv)
    if cmd == "lab":
        os.execv(str(BIN / "crashdrill"), [str(BIN / "crashdrill"), "serve", *argv[1:]])
    if cmd == "test":
        return run_tests()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Set up crashdrill in ./.venv and run it. Needs only Python ≥ 3.11.

    python3 quickstart.py lab     # set up, then the lab at http://127.0.0.1:8000
    python3 quickstart.py lab --instructor   # the same with instructor mode on (login link printed)
    python3 quickstart.py test    # set up with test tools, then the whole test suite
    python3 quickstart.py setup   # set up only (add --test for the test tools)

torch: on a machine with an NVIDIA GPU the regular (CUDA) build is installed. Without
one, a CPU build is taken instead of gigabytes of CUDA libraries: from a local wheel when
pip can find one, else from PyTorch's CPU index. Override with CRASHDRILL_TORCH_INDEX
(a pip index URL) or CRASHDRILL_TORCH="torch==X" for the requirement itself.
"""

from __future__ import annotations

import os
import secrets
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


def option(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv, else None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def instructor_token(argv: list[str]) -> str:
    """`lab --instructor`: CRASHDRILL_INSTRUCTOR_TOKEN when set, else the token kept in the
    lab's data dir (DATA_DIR/instructor_token, made once, readable by its owner only)."""
    if os.environ.get("CRASHDRILL_INSTRUCTOR_TOKEN"):
        return os.environ["CRASHDRILL_INSTRUCTOR_TOKEN"]
    data_dir = option(argv, "--data-dir")
    if data_dir is None:  # the server's own default, asked of the installed package
        code = "from crashdrill.server.settings import default_data_dir; print(default_data_dir())"
        data_dir = subprocess.run(
            [str(PY), "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
    path = Path(data_dir).expanduser() / "instructor_token"
    if path.is_file() and len(path.read_text().strip()) >= 16:
        say(f"instructor token read from {path}")
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    say(f"instructor token made and kept in {path} (the same one next time)")
    return token


def serve(argv: list[str]) -> None:
    """Replace this process with `crashdrill serve`; with --instructor, instructor mode on."""
    args = [a for a in argv if a != "--instructor"]
    if "--instructor" in argv:
        token = instructor_token(args)
        os.environ["CRASHDRILL_INSTRUCTOR_TOKEN"] = token
        host = option(args, "--host") or "127.0.0.1"
        port = option(args, "--port") or "8000"
        say(
            f"instructor mode on: log in with this link: http://{host}:{port}/instructor#token={token}"
        )
    os.execv(str(BIN / "crashdrill"), [str(BIN / "crashdrill"), "serve", *args])


def run_tests() -> int:
    status = 0
    steps: list[list[str | Path]] = [
        [BIN / "ruff", "check", "."],
        [BIN / "ruff", "format", "--check", "."],
        [BIN / "mypy", "server", "workers", "drill", "crashdrill/processes"],
        [PY, "scripts/lint_imports.py"],  # the layers: import-linter contracts in pyproject
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
        serve([a for a in argv[1:] if a != "--test"])
    if cmd == "test":
        return run_tests()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

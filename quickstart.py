#!/usr/bin/env python3
"""Set up crashdrill in ./.venv and run it. Needs only Python ≥ 3.11.

    python3 quickstart.py lab     # set up, then the lab at http://127.0.0.1:8000
    python3 quickstart.py lab --instructor   # the same with instructor mode on (login link printed)
    python3 quickstart.py test    # set up with test tools, then the whole test suite
    python3 quickstart.py setup   # set up only (add --test for the test tools)
    (lab, test and setup skip what is up to date; --reinstall installs everything again)
    python3 quickstart.py lock    # recompile requirements/*.txt from pyproject's extras

What is installed: pyproject's extras for the lab (server, gpu) or for the tests (every
extra), at the versions pinned in requirements/lab.txt or requirements/test.txt, the ones
the tests passed with (`--unlocked`: the newest that pyproject allows instead). `lock`
recompiles both with uv after pyproject's dependencies change; add `--upgrade` (or
`--upgrade-package NAME`) to move to newer releases. docs/development.md says more.

torch: on a machine with an NVIDIA GPU the regular (CUDA) build is installed. Without
one, a CPU build is taken instead of gigabytes of CUDA libraries: from a local wheel when
pip can find one, else from PyTorch's CPU index. Override with CRASHDRILL_TORCH_INDEX
(a pip index URL) or CRASHDRILL_TORCH="torch==X" for the requirement itself. torch is
installed first and is not in the lock (which build is right depends on the machine);
the lock pins its dependencies but not its CUDA libraries, which torch pins itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
REQUIREMENTS = ROOT / "requirements"
# The install sets: pyproject's extras each takes. `ray` and `frameworks` only for the tests
# (the Ray tier; the HF Trainer, Lightning and DCP scripts the drill is tried on): the
# default lab needs neither. Each set has its lock, requirements/<set>.txt.
INSTALL_SETS: dict[str, tuple[str, ...]] = {
    "test": ("server", "gpu", "data", "postgres", "gcs", "supabase", "ray", "frameworks", "test"),
    "lab": ("server", "gpu"),
}
LOCK_PYTHON = "3.11"  # the oldest Python pyproject allows: the lock resolves for it and up
UV = "uv==0.13.9"  # compiles the locks (`python3 quickstart.py lock`)
# torch's own requirements that are its CUDA stack: the CUDA build pins them exactly, the
# CPU build has none, so they stay out of the lock (requirements/torch.in).
CUDA_STACK = re.compile(r"^(nvidia-|triton|cuda-)", re.I)


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


def torch_present() -> bool:
    """Whether the venv still has the torch the stamp recorded, read from its metadata
    (cheap: importing torch takes seconds, longer on a busy machine)."""
    want = TORCH.split("==", 1)[1] if "==" in TORCH else None
    code = "import importlib.metadata as m; print(m.version('torch'))"
    out = subprocess.run([str(PY), "-c", code], capture_output=True, text=True)
    return out.returncode == 0 and (want is None or out.stdout.strip().startswith(want))


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


def lock_inputs(name: str) -> str:
    """A fingerprint of what requirements/<name>.txt is compiled from: pyproject's base
    dependencies and the set's extras, and the torch that quickstart installs."""
    import tomllib  # here, not at the top: on Python < 3.11 main() must still say why

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    unknown = [e for e in INSTALL_SETS[name] if e not in extras]
    if unknown:
        raise SystemExit(
            f"quickstart: install set {name!r} names extras pyproject lacks: {unknown}"
        )
    data = {
        "dependencies": project["dependencies"],
        "extras": {e: extras[e] for e in INSTALL_SETS[name]},
        "torch": TORCH,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


LOCK_STAMP = "# crashdrill lock of install set {name}: inputs {inputs}"


def lock_problem(name: str) -> str | None:
    """Why requirements/<name>.txt cannot be trusted as the tested versions, or None."""
    path = REQUIREMENTS / f"{name}.txt"
    if not path.is_file():
        return f"{path.relative_to(ROOT)} is missing: run `python3 quickstart.py lock`"
    first = path.read_text().split("\n", 1)[0]
    if first != LOCK_STAMP.format(name=name, inputs=lock_inputs(name)):
        return (
            f"{path.relative_to(ROOT)} was compiled from other dependencies than pyproject's"
            " now: run `python3 quickstart.py lock`"
        )
    return None


# What the venv and the web build were installed from, written once an install succeeded:
# the next start compares and skips an install whose inputs did not change. A clean clone
# (CI) has no venv, so no stamp: it installs.
PIP_STAMP = "crashdrill-installed-{name}.json"  # in the venv
WEB_STAMP = "crashdrill-web.json"  # in the venv too: vendor/ may be copied elsewhere
WEB_INPUTS = ("package.json", "package-lock.json")
VENDOR = ROOT / "web" / "static" / "vendor"


def file_sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def install_inputs(name: str) -> dict[str, object]:
    """What an install of set `name` depends on: its lock, pyproject, its extras, the torch
    requirement and the Python that runs it."""
    return {
        "lock": file_sha(REQUIREMENTS / f"{name}.txt"),
        "pyproject": file_sha(ROOT / "pyproject.toml"),
        "extras": list(INSTALL_SETS[name]),
        "torch": TORCH,
        "python": sys.version.split()[0],
    }


def web_inputs() -> dict[str, object]:
    """What the web build (scripts/build_web.py) depends on: package.json and its lock."""
    return {f: file_sha(ROOT / f) for f in WEB_INPUTS}


def up_to_date(stamp: Path, inputs: dict[str, object]) -> bool:
    try:
        return json.loads(stamp.read_text()) == inputs
    except (OSError, ValueError):
        return False


def write_stamp(stamp: Path, inputs: dict[str, object]) -> None:
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(inputs, sort_keys=True) + "\n")


def make_venv() -> None:
    if not PY.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)


def setup(test: bool, unlocked: bool = False, reinstall: bool = False) -> None:
    """Install set "test" or "lab" into the venv and build the page's vendor files; each
    part is skipped when its stamp says its inputs have not changed since it last
    succeeded (`reinstall`: never skipped; `unlocked`: pip always runs)."""
    make_venv()
    name = "test" if test else "lab"
    stamp = VENV / PIP_STAMP.format(name=name)
    inputs = install_inputs(name)
    if not unlocked and not reinstall and up_to_date(stamp, inputs) and torch_present():
        say(f"install set {name!r} is up to date (lock, pyproject, extras, torch): pip skipped")
    else:
        stamp.unlink(missing_ok=True)
        install_torch()
        extras = ",".join(INSTALL_SETS[name])
        problem = None if unlocked else lock_problem(name)
        if unlocked:
            pip("-e", f".[{extras}]")
        else:
            if problem:
                say(f"warning: {problem}; what pyproject adds since is installed unpinned")
            # the pins first, then this package with the set's extras: pip takes the pinned
            # versions, and torch stays the build install_torch chose
            pip("-r", f"requirements/{name}.txt", "-e", f".[{extras}]")
            if problem is None:
                write_stamp(stamp, inputs)  # an unpinned install is never "up to date"
    # front-end packages from npm (uPlot), never committed; without Node.js the page still
    # works and says that its charts are missing
    web_stamp = VENV / WEB_STAMP
    vendored = all((VENDOR / f).is_file() for f in ("uPlot.iife.min.js", "uPlot.min.css"))
    if not reinstall and vendored and up_to_date(web_stamp, web_inputs()):
        say("the page's vendor files are up to date (package-lock.json): web build skipped")
    elif sh(PY, "scripts/build_web.py", check=False) != 0:
        say("could not fetch uPlot from npm: the lab page will run without charts")
    else:
        write_stamp(web_stamp, web_inputs())
    if test:
        ensure_chromium()


def lock(argv: list[str]) -> int:
    """Recompile requirements/test.txt and requirements/lab.txt with uv from pyproject's
    extras; argv goes to `uv pip compile` (`--upgrade`, `--upgrade-package NAME`)."""
    make_venv()
    install_torch()  # its metadata says what torch itself requires
    if sh(PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", UV, check=False):
        say(f"could not install {UV} into {VENV}")
        return 1
    code = (
        "import importlib.metadata as m; "
        "print('\\n'.join(r for r in m.requires('torch') or [] if 'extra ==' not in r))"
    )
    requires = subprocess.run([str(PY), "-c", code], capture_output=True, text=True, check=True)
    kept = [r for r in requires.stdout.split("\n") if r and not CUDA_STACK.match(r)]
    (REQUIREMENTS / "torch.in").write_text(
        f"# What {TORCH} itself requires, but its CUDA stack (torch pins that exactly itself).\n"
        "# Written by `python3 quickstart.py lock` from the installed torch: do not edit.\n"
        + "".join(f"{r}\n" for r in kept)
    )
    for name in ("test", "lab"):  # lab within test's pins: it installs tested versions
        out = f"requirements/{name}.txt"
        cmd: list[str | Path] = [
            BIN / "uv",
            "pip",
            "compile",
            "pyproject.toml",
            "requirements/torch.in",
        ]
        cmd += [a for e in INSTALL_SETS[name] for a in ("--extra", e)]
        cmd += [
            "--universal",
            "--python-version",
            LOCK_PYTHON,
            "--override",
            "requirements/overrides.txt",
        ]
        cmd += [
            "--no-emit-package",
            "torch",
            "--custom-compile-command",
            "python3 quickstart.py lock",
            "--quiet",
        ]
        cmd += (["-c", "requirements/test.txt"] if name == "lab" else []) + ["-o", out, *argv]
        if sh(*cmd, check=False) != 0:
            say(f"FAILED: could not compile {out}")
            return 1
        path = ROOT / out
        lines = [x for x in path.read_text().split("\n") if not x.startswith("# crashdrill lock")]
        path.write_text("\n".join([LOCK_STAMP.format(name=name, inputs=lock_inputs(name)), *lines]))
        pins = sum(1 for x in lines if "==" in x and not x.startswith((" ", "#")))
        say(f"{out}: {pins} packages pinned")
    return 0


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


def eslint_step() -> list[list[str | Path]]:
    """eslint over the page's modules (eslint.config.mjs; installed from npm at setup by
    scripts/build_web.py); none, with the reason printed, where it cannot run."""
    eslint = ROOT / "node_modules" / ".bin" / "eslint"
    if shutil.which("node") is None:
        say("skipped: eslint over web/static (Node.js is not installed: apt-get install -y npm)")
        return []
    if not eslint.exists():
        say("skipped: eslint over web/static (npm could not install it: see build_web above)")
        return []
    return [[eslint, "web/static"]]


def run_tests() -> int:
    status = 0
    steps: list[list[str | Path]] = [
        [BIN / "ruff", "check", "."],
        [BIN / "ruff", "format", "--check", "."],
        *eslint_step(),  # the page's JS: web/static
        [PY, "scripts/typecheck.py"],  # mypy over the whole package, across modules
        [PY, "scripts/lint_imports.py"],  # the layers: import-linter contracts in pyproject
        [PY, "-m", "pytest", "tests", "-p", "no:cacheprovider", "--durations=30"],
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
    if not argv or argv[0] not in ("lab", "test", "setup", "lock"):
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs before any venv exists
        print("crashdrill needs Python ≥ 3.11", file=sys.stderr)
        return 2
    cmd = argv[0]
    if cmd == "lock":
        return lock(argv[1:])
    setup(
        test=cmd == "test" or "--test" in argv,
        unlocked="--unlocked" in argv,
        reinstall="--reinstall" in argv,
    )
    if cmd == "lab":
        serve([a for a in argv[1:] if a not in ("--test", "--unlocked", "--reinstall")])
    if cmd == "test":
        return run_tests()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

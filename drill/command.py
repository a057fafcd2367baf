"""Any training script as a drill target: `crashdrill verify [options] -- COMMAND…`.

The script learns where to checkpoint from `{ckpt_dir}` in its arguments or from the
environment variable CRASHDRILL_CKPT_DIR; the reference and the crashed run each get a
fresh directory. `{python}` in the command (and the resume arguments) is the interpreter
crashdrill itself runs in (sys.executable): `-- {python} train.py` runs the script with
the packages of crashdrill's venv, whatever `python` the PATH finds first. A first run
that dies at an import is told which interpreter ran and which one crashdrill uses
(`interpreter_hint`). The resume arguments are added on a restart only when that directory
holds a checkpoint file, not a temp file or a log (on every restart with
`resume_args_always`).
A kill "during a checkpoint write" is armed at a step and lands the moment a checkpoint
file in that directory changes. Only checkpoint files count, recognised by name and
content or named by `checkpoint_globs` (drill/checkpoint_files.py): an event log appended
at every step is neither progress nor a write.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

from crashdrill.drill.checkpoint_files import CheckpointFiles
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.rank_kill import stale_store_hint
from crashdrill.drill.snapshot import Snapshot, final_names
from crashdrill.drill.target import Segment, Target, WriteWatch
from crashdrill.drill.trace import LossParser
from crashdrill.drill.world_size import launcher_world_size, refused, with_world_size

PLACEHOLDER = "{ckpt_dir}"
PYTHON = "{python}"  # → sys.executable
ENV_VAR = "CRASHDRILL_CKPT_DIR"


class DirChangeWatch(WriteWatch):
    """Armed once the script prints the kill's step; fires at the first change in the
    checkpoint dir since the step line before it (a new temp file, a truncated file, a
    rename). The dir is compared with its state at that earlier line, not at the armed
    one: a script that starts its write right after printing the step has often begun
    it by the time the drill reads the line, and that write is the one to land in."""

    def __init__(
        self, root: Path, step: int, files: CheckpointFiles, after_write: int | None = None
    ) -> None:
        self.root = root
        self.files = files
        self.step = step
        self.after_write = after_write  # the reference's write before the one aimed at
        self.before: Snapshot | None = None  # at the last step line before `step`
        self.armed: Snapshot | None = None
        self.interval = 0.05

    def on_step(self, step: int) -> None:
        if step < self.step:
            self.before = self.files.scan(self.root)
        elif self.armed is None:
            self.armed = self.before if self.before is not None else self.files.scan(self.root)
            self.interval = 0.002  # a small script's write may last only milliseconds

    def poll(self) -> bool:
        return self.armed is not None and self.files.scan(self.root) != self.armed

    def shows_state_before(self, step: int) -> bool:
        # The lines after the write before the aimed one and before the armed line: the
        # armed snapshot is the last of them (the engine copies again only on a change).
        return step < self.step and (self.after_write is None or step > self.after_write)

    def snapshot_before(self) -> Snapshot | None:
        return self.armed


class CommandTarget(Target):
    files: CheckpointFiles  # always: a script's output dir holds logs beside checkpoints

    def __init__(
        self,
        argv: list[str],
        *,
        parser: LossParser,
        resume_args: list[str] | None = None,
        resume_args_always: bool = False,
        timeout: float = 600.0,
        cwd: str | None = None,
        rank: int | None = None,
        checkpoint_globs: list[str] | None = None,
        resume_world_size: int | None = None,
        tolerance: float | None = None,
    ) -> None:
        self.rank = rank
        # --resume-world-size: every restart runs at this many ranks (the command's
        # --nproc_per_node value replaced), judged within `tolerance` (drill/world_size.py)
        self.resume_world_size = resume_world_size
        self.tolerance = tolerance
        if resume_world_size is not None:
            self.world_size = launcher_world_size(argv)  # a ValueError naming what is missing
            if self.world_size == resume_world_size:
                raise ValueError(
                    f"--resume-world-size {resume_world_size} is the command's own "
                    "--nproc_per_node: give another number of ranks"
                )
        self.files = CheckpointFiles(checkpoint_globs or [])
        self.argv = list(argv)
        self.resume_args = list(resume_args or [])
        self.resume_args_always = resume_args_always
        self.parser = parser
        self.timeout = timeout
        self._cwd = cwd

    @property
    def cwd(self) -> str | None:
        return self._cwd

    def gets_resume_args(self, ckpt_dir: Path, restart: bool) -> bool | None:
        """On a restart, when the checkpoint dir holds a checkpoint (or always, with
        --resume-args-always): a script told to resume before its first checkpoint
        typically crashes, and the first kill lands there by design."""
        if not self.resume_args:
            return None
        if not restart:
            return False
        return self.resume_args_always or self.has_checkpoint(self.snapshot(ckpt_dir))

    def has_checkpoint(self, snap: Snapshot | None) -> bool:
        """Anything under a final name: a temp file (`x.tmp`, `tmp…/`) of a write under way
        is not a checkpoint yet (the drill may read the step line before the write began
        only once the temp file exists)."""
        return bool(final_names(snap))

    def command(self, ckpt_dir: Path, restart: bool) -> list[str]:
        resume = self.gets_resume_args(ckpt_dir, restart)
        argv = self.argv
        if (
            restart
            and self.resume_world_size is not None
            and self.has_checkpoint(self.snapshot(ckpt_dir))
        ):  # a resume at M ranks; a restart with nothing to resume starts fresh, at N
            argv = with_world_size(argv, self.resume_world_size)
        args = argv + (self.resume_args if resume else [])
        return [a.replace(PLACEHOLDER, str(ckpt_dir)).replace(PYTHON, sys.executable) for a in args]

    def environ(self, ckpt_dir: Path, kill: KillPoint | None) -> dict[str, str]:
        # Unbuffered stdout for Python scripts: a kill must not eat lines still in a buffer,
        # and the drill must see each step when it is printed.
        return {ENV_VAR: str(ckpt_dir), "PYTHONUNBUFFERED": "1"}

    def write_watch(self, ckpt_dir: Path, kill: KillPoint) -> WriteWatch:
        return DirChangeWatch(
            self.checkpoint_root(ckpt_dir), kill.step, self.files, kill.after_write
        )

    def refused(self, segment: Segment) -> bool:
        return self.resume_world_size is not None and refused(segment) is not None

    def failure_hint(self, segment: Segment) -> str | None:
        if segment.launcher_restart:
            lines = segment.peer_errors + segment.stderr_tail
            return stale_store_hint(lines, os.environ)
        return interpreter_hint(segment.argv, os.environ.get("PATH"), segment.stderr_tail)

    def describe(self) -> dict[str, object]:
        return {
            "command": self.argv,
            "resume_args": self.resume_args,
            "resume_args_always": self.resume_args_always,
            "rank": self.rank,
            "resume_world_size": self.resume_world_size,
            "tolerance": self.tolerance,
            "checkpoint_globs": self.files.globs,
            "loss_lines": self.parser.matched,  # the shape the reference's lines matched
            "loss_lines_text": self.parser.describe(),
        }


_IMPORT_ERROR = re.compile(
    r"\b(?:ModuleNotFoundError: No module named '(?P<module>[\w.]+)'"
    r"|(?:ModuleNotFoundError|ImportError): .+)"
)


def interpreter_of(argv0: str, path: str | None) -> tuple[str | None, str | None]:
    """(the program argv[0] resolves to on `path`, the Python interpreter that runs it: the
    program itself, or the one its `#!` line names), None where it cannot tell."""
    program = shutil.which(argv0, path=path) if os.sep not in argv0 else argv0
    if program is None:
        return None, None
    if re.match(r"python[\d.]*$", os.path.basename(program)):
        return program, program
    try:
        with open(program, "rb") as f:
            first = f.readline(256).decode("utf-8", "replace").strip()
    except OSError:
        return program, None
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = words[1:]
        found = shutil.which(words[0], path=path)
        words = [found, *words[1:]] if found else []
    if words and re.match(r"python[\d.]*$", os.path.basename(words[0])):
        return program, words[0]
    return program, None


def environment_of(python: str) -> str:
    """Which installation an interpreter belongs to: its venv (the dir with pyvenv.cfg;
    a venv's python is often a symlink to the system one), else the real file."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        return venv
    return os.path.realpath(python)


def interpreter_hint(argv: list[str], path: str | None, stderr: list[str]) -> str | None:
    """When a process died at an import: which interpreter ran the command (argv[0]
    resolved on the PATH the child got) and which one crashdrill uses, with the fix."""
    m = next((m for m in map(_IMPORT_ERROR.search, reversed(stderr)) if m), None)
    if m is None or not argv:
        return None
    program, python = interpreter_of(argv[0], path)
    if python is not None and environment_of(python) == environment_of(sys.executable):
        return None  # the same interpreter: the import fails for crashdrill's venv too
    module = m.group("module")
    have = ""
    if module:
        top = module.split(".")[0]
        if find_spec(top) is not None:
            have = f"; {top} is installed for crashdrill's interpreter"
    via = f" (Python {python})" if python and python != program else ""
    ran = f"{argv[0]!r} is {program}{via}" if program else f"{argv[0]!r} is not on the PATH"
    return (
        f"the script died at an import ({m.group(0).strip()}): {ran}, found on the PATH the "
        f"script got, while crashdrill runs in {sys.executable}{have}. Write "
        f"`{{python}}` for the interpreter in COMMAND (-- {{python}} {' '.join(argv[1:2])}…) "
        "to run the script with crashdrill's, or install the script's packages there"
    )

"""The trainer's loud start line: which of its three starts it made, said once on stderr.
One home for the line's text, which crosses a process boundary: the trainer prints it
(trainer/loop.py), and whoever must know where a restart resumed reads it back (the drill,
drill/builtin.py; the executors' conformance suite and the stand-in trainer in tests/).

    print(resumed_line(150, path), file=sys.stderr)  # crashdrill: resumed at step 150 from PATH
    print(FRESH_LINE, file=sys.stderr)    # crashdrill: no checkpoint found, starting fresh
    print(refused_line(root), file=sys.stderr)   # --require-checkpoint and none: exit 3
    read_start(text)    # Start("resumed", 150, "PATH"), Start("fresh", 0), Start("refused", …)
    resumed_step(text)  # 150 for that line, 0 for a fresh start, else None

`text` is lines (str: each line is taken as whole, as a reader that split them hands them
over) or what a reader has read of a byte stream so far (bytes: a last line without its
newline yet does not count, as in trainer/checkpoint_pause.py). Either way a line cut short
never names a wrong step: the step's digits count only when " from " follows them, and the
fresh and refused lines only when they are whole.

Imports nothing but the standard library: the drill and the tests read its names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_PREFIX = "crashdrill: "
FRESH_LINE = _PREFIX + "no checkpoint found, starting fresh"
_RESUMED = re.compile(re.escape(_PREFIX) + r"resumed at step (\d+) from (\S.*)$")
_REFUSED_END = " and --require-checkpoint is set; not training from scratch"
_REFUSED = re.compile(
    re.escape(_PREFIX + "no checkpoint found in ") + r"(.+)" + re.escape(_REFUSED_END) + "$"
)

StartKind = Literal["resumed", "fresh", "refused"]


@dataclass(frozen=True)
class Start:
    """What the start line said: `resumed` at `step` from the checkpoint at `path`;
    `fresh` (step 0, no path); `refused` (no step; `path` is where it looked)."""

    kind: StartKind
    step: int | None = None
    path: str | None = None


def resumed_line(step: int, path: object) -> str:
    """The line of a trainer that resumed at optimizer step `step` from checkpoint `path`."""
    return f"{_PREFIX}resumed at step {step} from {path}"


def refusal(ckpt_root: object) -> str:
    """Why a trainer told a checkpoint must exist (--require-checkpoint) refuses to start:
    it found none in `ckpt_root`. Its event's sentence says it too."""
    return f"no checkpoint found in {ckpt_root}{_REFUSED_END}"


def refused_line(ckpt_root: object) -> str:
    """The line of that refusal; the trainer then exits untrained (trainer/exit_codes.py
    EXIT_NO_CHECKPOINT)."""
    return _PREFIX + refusal(ckpt_root)


def _start_of(line: str) -> Start | None:
    line = line.rstrip("\r")
    found = _RESUMED.search(line)
    if found:
        return Start("resumed", int(found.group(1)), found.group(2))
    if line.endswith(FRESH_LINE):
        return Start("fresh", 0)
    refused = _REFUSED.search(line)
    if refused:
        return Start("refused", None, refused.group(1))
    return None


def read_start(text: str | bytes) -> Start | None:
    """The first start line in `text` (see the module's docstring for str and bytes), else
    None."""
    if isinstance(text, bytes):
        lines = [raw.decode("utf-8", "replace") for raw in text.split(b"\n")[:-1]]
    else:
        lines = text.splitlines()
    for line in lines:
        start = _start_of(line)
        if start is not None:
            return start
    return None


def resumed_step(text: str | bytes) -> int | None:
    """The step the trainer says it resumed from: the checkpoint's step, 0 for a fresh
    start; None when `text` holds no such line (a refusal included)."""
    start = read_start(text)
    return start.step if start is not None and start.kind != "refused" else None

"""The checkpoint-pause hook: hold a checkpoint's write open so that a SIGKILL lands inside
it. One home for its three parts, which cross a process boundary: the environment variable
that asks for it, its `STEP:SECONDS` format, and the stderr line the trainer prints when
the pause begins. And its opposite, for a hold (workers/hold.py): the lines a trainer
started with ANNOUNCE_ENV=1 prints as each checkpoint write begins and ends, so that the
supervisor never stops it inside one.

    env = {ENV: format_pause([100, 200], 1.0)}   # "100:1,200:1", for the trainer's start
    parse_pause("100:1,200:0.5")                 # {100: 1.0, 200: 0.5}, or PauseError
    pauses_from_env(os.environ)                  # the same, read from ENV ({} when unset)
    print(paused_line(100), file=sys.stderr)     # what the trainer prints as it pauses
    paused_step(line)                            # 100 for that line, else None
    env = {ANNOUNCE_ENV: "1"}                    # the lab's trainers say their writes:
    print(writing_line(100), file=sys.stderr)    # as the write of step 100 begins …
    print(written_line(100), file=sys.stderr)    # … and once it has ended (or failed)
    write_open(stderr_text)                      # 100 while that write is open, else None
    without_write_lines(stderr_tail)             # a failure's tail for people, without them

The value is `STEP:SECONDS[,STEP:SECONDS…]`: the checkpoint of optimizer step STEP (a
whole number ≥ 0) is held open SECONDS (a number ≥ 0) after its payload files exist in its
temporary directory and before the rename and the manifest (trainer/checkpoint.py). The
lab sets it for a crash mode whose kill waits for a write (trainer/crash_modes.py), the
drill for a kill it placed inside a write (drill/builtin.py); whoever waits for the pause
reads the stderr line with `paused_step` (workers/supervisor.py, drill/builtin.py).

Imports nothing but the standard library: the supervisor, the server and the drill read
its names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

ENV = "CRASHDRILL_CKPT_PAUSE"
ANNOUNCE_ENV = "CRASHDRILL_CKPT_ANNOUNCE"  # "1": say each write's begin and end on stderr
_SAID = "crashdrill: paused inside checkpoint write at step "  # and the step's number
_WRITING = "crashdrill: checkpoint write begins at step "
_WRITTEN = "crashdrill: checkpoint write ends at step "
_WRITE_LINE = re.compile(
    "(" + re.escape(_WRITING) + "|" + re.escape(_WRITTEN) + r")(\d+)\r?$", re.MULTILINE
)
# The line ends after the step's digits. In a byte stream only a line with its newline
# counts: one cut short by a read ("…at step 15" of "…at step 150") would name the wrong step.
_PAUSED = re.escape(_SAID) + r"(\d+)"
_PAUSED_TEXT = re.compile(_PAUSED + r"\r?$", re.MULTILINE)
_PAUSED_BYTES = re.compile(_PAUSED.encode() + rb"\r?\n")
FORMAT = "STEP:SECONDS[,STEP:SECONDS…] (STEP a whole number ≥ 0, SECONDS a number ≥ 0)"


class PauseError(ValueError):
    """A value of the pause variable that is not `STEP:SECONDS[,…]`: names the item and
    what is allowed."""


def format_pause(steps: int | Iterable[int], seconds: float) -> str:
    """The variable's value that holds the write of each of `steps` open `seconds`."""
    if seconds < 0 or not math.isfinite(seconds):
        raise PauseError(f"{ENV}: seconds = {seconds!r} is not allowed: a number ≥ 0")
    text = f"{seconds:g}"
    if float(text) != seconds:  # %g keeps 6 digits: say it exactly instead
        text = repr(float(seconds))
    items = [steps] if isinstance(steps, int) else sorted(set(steps))
    for step in items:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise PauseError(f"{ENV}: step = {step!r} is not allowed: a whole number ≥ 0")
    return ",".join(f"{step}:{text}" for step in items)


def parse_pause(value: str) -> dict[int, float]:
    """{step: seconds} from the variable's value ("" means no pause); PauseError names the
    item that is not STEP:SECONDS and what is allowed."""
    pauses: dict[int, float] = {}
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        step_text, sep, seconds_text = item.partition(":")
        step_text, seconds_text = step_text.strip(), seconds_text.strip()
        if not sep or not step_text.isdigit():
            raise PauseError(f"{ENV}={value!r}: item {item!r} is not allowed: {FORMAT}")
        try:
            seconds = float(seconds_text)
        except ValueError:
            seconds = math.nan
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise PauseError(
                f"{ENV}={value!r}: item {item!r} has seconds {seconds_text!r}, not a number"
                f" ≥ 0: {FORMAT}"
            )
        pauses[int(step_text)] = seconds
    return pauses


def pauses_from_env(environ: Mapping[str, str]) -> dict[int, float]:
    """The pauses that `environ` asks for ({} when the variable is unset or empty)."""
    return parse_pause(environ.get(ENV, ""))


def paused_line(step: int) -> str:
    """The stderr line the trainer prints when the write of step `step` pauses."""
    return f"{_SAID}{step}"


def paused_step(text: str | bytes) -> int | None:
    """The step of the first pause announced in `text`, else None: `text` is lines (str)
    or what a reader has read of a byte stream so far (bytes: a last line without its
    newline yet does not count)."""
    if isinstance(text, bytes):
        found = _PAUSED_BYTES.search(text)
        return int(found.group(1)) if found else None
    match = _PAUSED_TEXT.search(text)
    return int(match.group(1)) if match else None


def announces(environ: Mapping[str, str]) -> bool:
    """Whether a trainer with `environ` says each checkpoint write's begin and end."""
    return environ.get(ANNOUNCE_ENV, "") == "1"


def writing_line(step: int) -> str:
    """The stderr line an announcing trainer prints as the write of step `step` begins."""
    return f"{_WRITING}{step}"


def written_line(step: int) -> str:
    """… and once that write has ended, complete or failed."""
    return f"{_WRITTEN}{step}"


def write_open(text: str | bytes) -> int | None:
    """The step of a checkpoint write that `text` (the end of an announcing trainer's
    stderr) says began and has not ended yet, else None. Only whole lines count."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a last line without its newline yet
    begun: set[int] = set()
    for match in _WRITE_LINE.finditer(text):
        step = int(match.group(2))
        if match.group(1) == _WRITING:
            begun.add(step)
        else:
            begun.discard(step)
    return max(begun) if begun else None


def without_write_lines(text: str) -> str:
    """`text` (an announcing trainer's stderr) without its write lines: the tail of a
    failure that people read keeps the traceback, not the checkpoint cadence."""
    kept = [line for line in text.splitlines(keepends=True) if not _WRITE_LINE.search(line)]
    return "".join(kept)

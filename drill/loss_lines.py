"""The common shapes of a loss line, recognised without a flag.

    shape = first_shape('iter 120: loss 2.3411, time 12.3ms')   # SHAPES["nanogpt"]
    shape.read('iter 121: loss 2.3398')                         # Reading("121", "2.3398", None)

Each shape reads one stdout line into a `Reading` (the step and the loss as printed, the
float32 bits when the line carries them) or None. The drill decides the shape once, from
the first line of the reference run that any shape reads, and reads every later line of
both runs with that shape alone (drill/trace.py): a crashed run is never parsed another
way than its reference. `--loss-regex` replaces them all.

In the order they are tried (the first that reads a line wins):

    json         {"step": 120, "loss": 2.3411216735839844}          JSON lines (loss_bits too)
    huggingface  {'loss': 2.3411, 'learning_rate': 4e-05, 'epoch': 0.5, 'step': 120}
    huggingface-counted  {'loss': 2.3411, 'grad_norm': 1.2, 'epoch': 0.5}   no step: counted
    nanogpt      iter 120: loss 2.3411, time 12.34ms, mfu 1.23%
    step-bar     step 120 | loss 2.3411          (also `step 120/300 | loss: 2.3411`)
    number-bar   120 | loss 2.3411
    progress     12/300 [00:01<00:20, 10.5it/s, loss=2.31]   or   step=12 loss=2.31

A Hugging Face Trainer prints its log dicts (Python reprs) without the step: the
`huggingface-counted` shape numbers the lines a process prints (the Nth is step N), and
places a restarted process's first line by its `epoch`, looked up on the reference's lines
(the Trainer's epoch is a function of the step). The report says so.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

# A number as a script prints it (Python, numpy, C printf): 2.3411, -1e-05, .5, nan, inf.
NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf|infinity|Infinity)"


@dataclass(frozen=True)
class Reading:
    """What one line says: the step (None: the line carries none, it is counted), the
    loss as printed (a str) or as JSON parsed it, the float32 bits when printed, and the
    `epoch` text of a counted line (to place a restart's first line)."""

    step: object
    loss: object
    bits: int | None = None
    epoch: str | None = None


@dataclass(frozen=True)
class LineShape:
    name: str
    example: str
    what: str  # a few words for the report
    read: Callable[[str], Reading | None]
    counted: bool = False  # the lines carry no step: the Nth line of a process is step N

    def describe(self) -> str:
        how = (
            " — the lines carry no step: each process's lines are counted (the Nth is step N),"
            " a restarted process's first line placed by its 'epoch' on the reference's lines"
            if self.counted
            else ""
        )
        return f"{self.what} ({self.name}: {self.example!r}){how}"


def _json(line: str) -> Reading | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        # parse_float=str keeps the printed digits: "2.3411" stays "2.3411"
        obj = json.loads(line, parse_float=str)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "step" not in obj or "loss" not in obj:
        return None
    bits = obj.get("loss_bits")
    bits = bits if isinstance(bits, int) and not isinstance(bits, bool) else None
    return Reading(obj["step"], obj["loss"], bits)


_NON_FINITE = re.compile(r"(?<![\w'\"])-?(nan|inf)(?![\w'\"])")
_HF_LOSS = re.compile(rf"['\"]loss['\"]\s*:\s*(?P<loss>{NUM})(?=\s*[,}}])")
_HF_EPOCH = re.compile(rf"['\"]epoch['\"]\s*:\s*(?P<epoch>{NUM})(?=\s*[,}}])")


def _hf_dict(line: str) -> dict[object, object] | None:
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")) or "loss" not in line:
        return None
    try:
        # literals only: no name is looked up, nothing called; nan/inf are no literals
        obj = ast.literal_eval(_NON_FINITE.sub("0", line))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return obj if isinstance(obj, dict) and "loss" in obj else None


def _huggingface(line: str) -> Reading | None:
    obj = _hf_dict(line)
    m = _HF_LOSS.search(line)
    if obj is None or m is None:
        return None
    step = obj.get("step", obj.get("global_step"))
    return Reading(step, m.group("loss")) if step is not None else None


def _huggingface_counted(line: str) -> Reading | None:
    obj = _hf_dict(line)
    m, e = _HF_LOSS.search(line), _HF_EPOCH.search(line)
    if obj is None or m is None or e is None or "step" in obj or "global_step" in obj:
        return None
    return Reading(None, m.group("loss"), epoch=e.group("epoch"))


def _regex(*patterns: str) -> Callable[[str], Reading | None]:
    compiled = [re.compile(p) for p in patterns]

    def read(line: str) -> Reading | None:
        for rx in compiled:
            m = rx.search(line)
            if m:
                return Reading(m.group("step"), m.group("loss"))
        return None

    return read


_LOSS_AFTER = rf"\s*[:=]?\s*(?P<loss>{NUM})(?![\w.])"

SHAPES: dict[str, LineShape] = {
    s.name: s
    for s in (
        LineShape("json", '{"step": 120, "loss": 2.3411}', "JSON lines with step and loss", _json),
        LineShape(
            "huggingface",
            "{'loss': 2.3411, 'epoch': 0.5, 'step': 120}",
            "Hugging Face log dicts with a step",
            _huggingface,
        ),
        LineShape(
            "huggingface-counted",
            "{'loss': 2.3411, 'grad_norm': 1.2, 'epoch': 0.5}",
            "Hugging Face log dicts",
            _huggingface_counted,
            counted=True,
        ),
        LineShape(
            "nanogpt",
            "iter 120: loss 2.3411",
            "nanoGPT iteration lines",
            _regex(rf"\biter\s+(?P<step>\d+)\s*:\s*loss{_LOSS_AFTER}"),
        ),
        LineShape(
            "step-bar",
            "step 120 | loss 2.3411",
            "step | loss lines",
            _regex(rf"\bstep\s*[:=]?\s*(?P<step>\d+)(?:/\d+)?\s*\|\s*loss{_LOSS_AFTER}"),
        ),
        LineShape(
            "number-bar",
            "120 | loss 2.3411",
            "number | loss lines",
            _regex(rf"^\s*(?P<step>\d+)(?:/\d+)?\s*\|\s*loss{_LOSS_AFTER}"),
        ),
        LineShape(
            "progress",
            "12/300 [00:01<00:20, loss=2.31]",
            "loss=X progress lines",
            _regex(
                rf"(?<![\d/])(?P<step>\d+)/\d+(?![\d/]).*?\bloss\s*[=:]\s*(?P<loss>{NUM})(?![\w.])",
                rf"\bstep\s*[=:]\s*(?P<step>\d+)\b.*?\bloss\s*[=:]\s*(?P<loss>{NUM})(?![\w.])",
            ),
        ),
    )
}


def first_shape(line: str) -> LineShape | None:
    """The first shape that reads this line."""
    for shape in SHAPES.values():
        if shape.read(line) is not None:
            return shape
    return None


def shape_names() -> str:
    return ", ".join(f"{s.name} ({s.example!r})" for s in SHAPES.values())

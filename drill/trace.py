"""Losses from a training script's stdout, and how precisely the script prints them.

A step line is a line of one of the common shapes (drill/loss_lines.py: JSON lines with
`step` and `loss`, and optionally `loss_bits`, the float32's IEEE-754 bits, which the
built-in trainer prints; nanoGPT's `iter N: loss X`; `step N | loss X`; `N | loss X`;
Hugging Face's log dicts; `loss=X` progress lines), or whatever a regex with the named
groups `step` and `loss` matches:

    {"step": 120, "loss": 2.3411216735839844}   JSON lines
    {"step": 9, "loss": null, "loss_bits": 2143289344}   a NaN loss (a diverged step)
    iter 120: loss 2.3411     nanoGPT; or --loss-regex 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'

Without a regex the shape is decided once, from the first line the reference run prints
that any shape reads, and the crashed run is read with the same shape.

The loss is kept as the text the script printed: comparing two runs "at the precision the
script prints" means comparing what it printed, and the digits tell whether that is
enough to prove bit-identity.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass

from crashdrill.drill.loss_lines import SHAPES, LineShape, first_shape, shape_names
from crashdrill.trainer.record_contract import bits_to_float32, round_to_float32
from crashdrill.trainer.resume_compare import Reading

# float32 needs 9 significant decimal digits to round-trip any value (FLT_DECIMAL_DIG).
FLOAT32_DIGITS = 9

EXAMPLE_REGEXES = (
    r"iter (?P<step>\d+): loss (?P<loss>\S+)",
    r"step (?P<step>\d+) \| loss (?P<loss>\S+)",
)


class TraceError(ValueError):
    """A loss pattern that cannot work (bad regex, missing named groups)."""


@dataclass(frozen=True)
class StepPoint:
    step: int
    text: str  # the loss exactly as printed
    value: float
    bits: int | None  # float32 bits when the script printed them
    t: float  # time.monotonic() when the line was read

    @property
    def reading(self) -> Reading:
        """The loss as the resume comparison (trainer/resume_compare.py) takes it."""
        return Reading(self.value, self.bits)

    def same_as(self, other: StepPoint) -> bool:
        """Equal at the precision both lines carry: bits when both have them, else the
        printed value."""
        return self.reading.same_as(other.reading)

    def delta(self, other: StepPoint) -> float:
        return self.reading.delta(other.reading)


class LossParser:
    """Turns one stdout line into a StepPoint, or None when the line is not a step.

    With a regex, the lines it matches. Without one, the common shapes of a loss line
    (drill/loss_lines.py): the shape is decided once, by the first line any shape reads
    (the reference run's, which runs first), and every later line, of every process of the
    drill, is read with that shape alone. `shape=` fixes it from the start (the built-in
    trainer prints JSON lines). Counted shapes (a line with no step) are numbered per
    process: `for_process()` gives each process its own count."""

    def __init__(self, regex: str | None = None, *, shape: str | None = None) -> None:
        self.regex: re.Pattern[str] | None = None
        self.shape: LineShape | None = None
        self._lock = threading.Lock()
        self._epochs: dict[str, int] = {}  # counted shapes: epoch text → step (reference)
        self._default: LineReader | None = None
        if shape is not None:
            if shape not in SHAPES:
                raise TraceError(f"unknown loss-line shape {shape!r}; known: {shape_names()}")
            self.shape = SHAPES[shape]
        if regex is not None:
            try:
                self.regex = re.compile(regex)
            except re.error as e:
                raise TraceError(f"--loss-regex {regex!r} is not a valid regex: {e}") from None
            missing = {"step", "loss"} - set(self.regex.groupindex)
            if missing:
                raise TraceError(
                    f"--loss-regex {regex!r} needs the named groups (?P<step>…) and (?P<loss>…);"
                    f" missing: {', '.join(sorted(missing))}. Example: {EXAMPLE_REGEXES[0]!r}"
                )

    @property
    def matched(self) -> str | None:
        """How the lines were read: "regex", a shape's name, or None (nothing read yet)."""
        if self.regex is not None:
            return "regex"
        return self.shape.name if self.shape else None

    def describe(self) -> str:
        if self.regex is not None:
            return f"--loss-regex {self.regex.pattern!r}"
        if self.shape is not None:
            return self.shape.describe()
        return f"none of the loss-line shapes matched: {shape_names()}"

    def shape_of(self, line: str) -> LineShape | None:
        """The shape that would read this line (without deciding anything)."""
        return first_shape(line) if self.regex is None else None

    def for_process(self) -> LineReader:
        """A reader for one process's stdout (its own count of a counted shape)."""
        return LineReader(self)

    def parse(self, line: str, t: float) -> StepPoint | None:
        if self._default is None:
            self._default = self.for_process()
        return self._default.parse(line, t)

    def _decide(self, line: str) -> LineShape | None:
        with self._lock:
            if self.shape is None:
                self.shape = first_shape(line)
            return self.shape


class LineReader:
    """One process's lines, read by its drill's LossParser."""

    def __init__(self, parser: LossParser) -> None:
        self.parser = parser
        self.count = 0  # counted shapes: the step of the last line read

    def parse(self, line: str, t: float) -> StepPoint | None:
        p = self.parser
        if p.regex is not None:
            m = p.regex.search(line)
            return _point(m.group("step"), m.group("loss"), None, t) if m else None
        shape = p.shape or p._decide(line)
        if shape is None:
            return None
        r = shape.read(line)
        if r is None:
            return None
        step = r.step
        if shape.counted:
            step = self._count(r.epoch)
        loss = r.loss
        if loss is None and r.bits is not None:
            # A non-finite loss is null in JSON (docs/run-contract.md), its bits exact:
            # the step a run diverged at is a point too, compared by its bits.
            loss = repr(bits_to_float32(r.bits))
        return _point(step, loss, r.bits, t)

    def _count(self, epoch: str | None) -> int:
        epochs = self.parser._epochs
        if self.count == 0 and epoch is not None and epochs.get(epoch, 0) > 0:
            self.count = epochs[epoch]  # a restart: where the reference printed this epoch
        else:
            self.count += 1
        if epoch is not None:
            if epochs.get(epoch, self.count) != self.count:
                epochs[epoch] = 0  # printed at two steps: says nothing about where a line is
            else:
                epochs.setdefault(epoch, self.count)
        return self.count


def _point(step: object, loss: object, bits: int | None, t: float) -> StepPoint | None:
    if isinstance(step, bool) or isinstance(loss, bool):
        return None
    try:
        step_i = int(step) if isinstance(step, int | str) else None
        text = repr(loss) if isinstance(loss, int | float) else loss
        text = text if isinstance(text, str) else None
        value = float(text) if text is not None else None
    except ValueError:
        return None
    if step_i is None or text is None or value is None:
        return None
    if bits is not None:
        value = bits_to_float32(bits)
    return StepPoint(step_i, text, value, bits, t)


# ---------------------------------------------------------------- precision


def significant_digits(text: str) -> int:
    """Significant digits in a printed number: '2.3411' → 5, '0.00120' → 3, '1e-05' → 1."""
    mantissa = re.split(r"[eE]", text.strip().lstrip("+-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    return max(len(digits), 1) if any(c.isdigit() for c in mantissa) else 0


def _fraction_digits(text: str) -> int | None:
    if re.search(r"[eE]", text):
        return None
    _, dot, frac = text.partition(".")
    return len(frac) if dot else 0


def _shortest_float32_text(text: str) -> bool:
    """True when `text` is the shortest decimal that round-trips its float32 — what
    numpy prints for a float32 (`str(np.float32(x))`)."""
    try:
        value = float(text)
    except ValueError:
        return False
    if not math.isfinite(value):
        return True
    f = round_to_float32(value)
    for d in range(1, FLOAT32_DIGITS + 1):
        s = f"{f:.{d}g}"
        if round_to_float32(float(s)) == f:
            return float(s) == value
    return False


@dataclass(frozen=True)
class Precision:
    """How exactly a trace pins down each loss.

    kind: "bits" (float32 bits printed), "exact" (≥ 9 significant digits: every float32
    is pinned), "shortest" (the shortest round-trip text of each float32, as numpy prints
    it: exact too), "rounded" (a fixed or short format: equal text is not equal bits),
    "none" (no losses)."""

    kind: str
    digits: int | None  # most significant digits printed (None for bits)

    @property
    def exact(self) -> bool:
        return self.kind in ("bits", "exact", "shortest")

    def describe(self) -> str:
        if self.kind == "bits":
            return "exact float32 bits (loss_bits)"
        if self.kind == "exact":
            return f"{self.digits} significant digits printed: enough to pin every float32"
        if self.kind == "shortest":
            return "shortest round-trip float32 text: enough to pin every float32"
        if self.kind == "none":
            return "no losses printed"
        return (
            f"the script prints at most {self.digits} significant digits; float32 needs "
            f"{FLOAT32_DIGITS} to be exact, so equal here means equal to {self.digits} "
            "digits, not bit-identical"
        )


def classify_precision(points: list[StepPoint]) -> Precision:
    """Decide from a whole trace whether its printed losses are exact.

    A single '2.3411' cannot tell a rounded print from a float32 that happens to be short;
    a trace can: shortest-float32 printing gives 8 digits for most values and lengths that
    vary, while a fixed format ('%.4f', round(x, 4)) repeats one length or never reaches 8
    digits."""
    if not points:
        return Precision("none", None)
    if all(p.bits is not None for p in points):
        return Precision("bits", None)
    texts = [p.text for p in points if math.isfinite(p.value)]
    if not texts:
        return Precision("rounded", 0)
    sig = [significant_digits(t) for t in texts]
    most = max(sig)
    if most >= FLOAT32_DIGITS:
        return Precision("exact", most)
    fracs = [_fraction_digits(t) for t in texts]
    fixed = len(texts) >= 3 and (len(set(sig)) == 1 or (None not in fracs and len(set(fracs)) == 1))
    if not fixed and most >= 8 and all(_shortest_float32_text(t) for t in texts):
        return Precision("shortest", most)
    return Precision("rounded", most)


def step_spacing(points: list[StepPoint]) -> int:
    """The usual gap between printed steps (1 for a script that prints every step)."""
    gaps = Counter(b.step - a.step for a, b in itertools.pairwise(points))
    positive = [(n, g) for g, n in gaps.items() if g > 0]
    return max(positive)[1] if positive else 1

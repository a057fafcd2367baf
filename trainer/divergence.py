"""A run whose loss (or gradient norm) is no longer a finite number has diverged: it stops
at once, in a state of its own, and never saves what it has become.

    what = nonfinite(loss, grad_norm)   # "the loss is nan", or None while all is finite
    text = diverged_text(step, what, last_checkpoint=150)
    print(diverged_line(step, what), file=sys.stderr)   # the loud line the drill reads back
    parse_diverged_line(line)                            # (step, what), or None
    record_divergence(rec, step=..., what=..., loss=..., ...)   # the records it writes

The loop checks the loss right after the forward pass, before backward, and the gradient
norm before the optimizer's update: the weights never take a NaN in, and no checkpoint is
written after it (the newest one on disk is from before). The trainer then writes the
step's record (its loss null, its `loss_bits` exact: record_contract.py), an event with
CODE, the stage STAGE, prints `diverged_line` on stderr and exits
EXIT_DIVERGED (4, trainer/exit_codes.py). A supervisor does not restart it (a restart
would diverge again, from the same checkpoint, bit for bit); the lab marks the run
"diverged", not "failed".

Imports nothing but the standard library: the supervisor and the server read these names.
"""

from __future__ import annotations

import math
import re
from typing import Any, Protocol

from crashdrill.trainer.record_contract import float32_bits
from crashdrill.trainer.stages import Stage

CODE = "diverged"  # the event's code
STAGE = Stage.DIVERGED  # the stage record's stage, and the lab's run state


def _word(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def nonfinite(loss: float, grad_norm: float | None = None) -> str | None:
    """What is not finite ("the loss is nan", "the gradient norm is inf"), else None."""
    if not math.isfinite(loss):
        return f"the loss is {_word(loss)}"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return f"the gradient norm is {_word(grad_norm)}"
    return None


# `crashdrill: diverged at step 9: the loss is nan; stopped`: written here, read back by
# the drill (drill/builtin.py), so that the two never disagree on its wording.
_LINE = re.compile(r"crashdrill: diverged at step (\d+): (.+); stopped$")


def diverged_line(step: int, what: str) -> str:
    """The line the trainer prints on stderr when it stops at update `step`."""
    return f"crashdrill: diverged at step {step}: {what}; stopped"


def parse_diverged_line(line: str) -> tuple[int, str] | None:
    """(step, what) from a line `diverged_line` wrote, else None."""
    m = _LINE.search(line.rstrip())
    return (int(m.group(1)), m.group(2)) if m else None


def diverged_text(step: int, what: str, last_checkpoint: int | None) -> str:
    """The sentence of the event and of the run's message."""
    kept = (
        f"the newest checkpoint is from step {last_checkpoint}"
        if last_checkpoint is not None
        else "it has no checkpoint"
    )
    return (
        f"Diverged at step {step}: {what}. Training stopped there and saved nothing after it"
        f" ({kept}). A restart would diverge again the same way: lower the learning rate, keep"
        " the warmup or the gradient clipping, then start a new pair."
    )


class _Records(Protocol):
    def write(self, kind: str, **fields: Any) -> dict[str, Any]: ...
    def event(
        self, code: str, text: str, level: str | None = None, **fields: Any
    ) -> dict[str, Any]: ...


def record_divergence(
    rec: _Records,
    *,
    step: int,
    what: str,
    loss: float,
    lr: float,
    grad_norm: float | None,
    tokens: int,
    mem_kind: str,
    checkpoint_step: int | None,
    progress: float,
) -> str:
    """Write what a divergence at update `step` leaves in the records: the step's record
    (its loss null in JSON, `loss_bits` exact; no timing), the event (CODE, with `what`
    and the newest checkpoint's step) and the stage STAGE. Returns the event's sentence."""
    rec.write(
        "step",
        step=step,
        loss=loss,
        loss_bits=float32_bits(loss),
        lr=lr,
        grad_norm=grad_norm,
        tokens=tokens,
        tokens_per_s=0.0,
        mfu=None,
        mem_bytes=None,
        mem_kind=mem_kind,
        dt=0.0,
    )
    text = diverged_text(step, what, checkpoint_step)
    rec.event(CODE, text, step=step, what=what, checkpoint_step=checkpoint_step)
    rec.write("stage", stage=STAGE, progress=progress)
    return text

"""The kill-and-resume drill (`crashdrill verify`): SIGKILL a training run at seeded random
points, resume it, and compare its trace with an uninterrupted reference bit for bit —
for the built-in trainer and for any training script. See docs/verify.md.

    from crashdrill.drill import assert_resumes_bit_identical, verify_command
    assert_resumes_bit_identical(["python", "train.py"], kills=2, seed=1)  # DrillFailed
    result = verify_command(["python", "train.py"], parser=LossParser(), kills=2, seed=1)

Importing the package is cheap: the names below load their modules when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "verify_command": "crashdrill.drill.verify",
    "verify_preset": "crashdrill.drill.verify",
    "DrillResult": "crashdrill.drill.verify",
    "LossParser": "crashdrill.drill.trace",
    "assert_resumes_bit_identical": "crashdrill.drill.api",
    "DrillFailed": "crashdrill.drill.api",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

"""Every deterministic field of the built-in trainer's records, resume by resume.

The drill reads losses from a script's stdout, which is all that any script gives. The
built-in trainer also writes its run records (docs/run-contract.md) into the run dir, and
those say more: grad norm, lr, tokens, val loss and its train mean, every probe, the
sample. A resume that is bit-identical reproduces all of them, so `crashdrill verify
--preset` compares each record a resumed process wrote with the reference's record of the
same kind and step, field by field, through the lab's comparison
(trainer/resume_compare.py):

    records = RunRecords.read(ref_dir, crash_dir)        # before the dirs are removed
    fields = records.compare(segment=1)                   # (FieldComparison, ...)
    names = differing(fields)                             # ["val.train_loss"]

Imports no torch: the drill reads JSON lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashdrill.trainer.resume_compare import (
    COMPARED_KINDS,
    LOSS,
    FieldComparison,
    compare_records,
    differing,
)
from crashdrill.trainer.run_files import RECORDS_FILE, read_records

Key = tuple[str, int]  # (kind, step)


@dataclass(frozen=True)
class RunRecords:
    """The compared records of the reference run and of the crashed run (every segment)."""

    reference: Mapping[Key, Mapping[str, Any]]
    crashed: Sequence[tuple[int, Key, Mapping[str, Any]]]  # (segment, key, record)

    @classmethod
    def read(cls, reference_dir: Path, crashed_dir: Path) -> RunRecords:
        ref: dict[Key, Mapping[str, Any]] = {}
        for _segment, key, rec in _compared(reference_dir):
            ref.setdefault(key, rec)
        return cls(ref, list(_compared(crashed_dir)))

    def compare(self, segment: int, with_killed: bool = False) -> tuple[FieldComparison, ...]:
        """Every field of the records that `segment` wrote, against the reference's; with
        `with_killed`, against the crashed run's own earlier segments instead (the latest
        that wrote each record: the killed process's, once the run had left the reference,
        as its losses are compared)."""
        mine: dict[Key, Mapping[str, Any]] = {}
        earlier: dict[Key, Mapping[str, Any]] = {}
        for seg, key, rec in self.crashed:
            if seg == segment:
                mine.setdefault(key, rec)  # the first one it wrote, as the lab keeps it
            elif seg < segment:
                earlier[key] = rec  # in segment order: the latest earlier one wins
        originals = earlier if with_killed else self.reference
        return compare_records(
            (key[1], originals[key], rec) for key, rec in mine.items() if key in originals
        )


def _compared(run_dir: Path) -> list[tuple[int, Key, Mapping[str, Any]]]:
    records, _ = read_records(run_dir / RECORDS_FILE)
    out: list[tuple[int, Key, Mapping[str, Any]]] = []
    for rec in records:
        kind, step, segment = rec.get("kind"), rec.get("step"), rec.get("segment", 0)
        if kind in COMPARED_KINDS and isinstance(step, int) and isinstance(segment, int):
            out.append((segment, (str(kind), step), rec))
    return out


def fields_summary(fields: Sequence[FieldComparison]) -> str:
    """One line: "loss and 16 other metrics: bit-identical", or the fields that differ
    with the first step of each."""
    compared = [f for f in fields if f.points]
    bad = [f for f in compared if f.identical is False]
    if not bad:
        others = len([f for f in compared if f.field != LOSS])
        if len(compared) == others:
            return f"{others} metric{'s' if others != 1 else ''}: bit-identical"
        return f"loss and {others} other metric{'s' if others != 1 else ''}: bit-identical"
    named = ", ".join(f"{f.field} (from step {f.first_divergent_step})" for f in bad)
    return f"{len(bad)} of {len(compared)} metrics differ: {named}"


def field_verdict(fields: Sequence[FieldComparison]) -> tuple[str, str] | None:
    """The verdict and the finding when the losses match and other fields do not (None:
    every field is the same)."""
    names = differing(fields)
    if not names:
        return None
    first = min(
        (f for f in fields if f.identical is False),
        key=lambda f: f.first_divergent_step or 0,
    )
    step = first.first_divergent_step
    finding = (
        f"the losses match but {', '.join(names)} differ from the reference (first "
        f"{first.field} at step {step}): what the run reports depends on state that the "
        "checkpoint does not hold or the resume does not restore — a generator that the "
        "probes or samples draw from, a window of recent losses, a counter"
    )
    return f"{first.field} differs at step {step}", finding

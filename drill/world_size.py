"""The world-size trial (`--resume-world-size M --tolerance T`): a run killed at N ranks
resumes at M, and is judged within a stated tolerance, since the bits cannot match.

    launcher_world_size(["torchrun", "--nproc_per_node", "2", "train.py"])   # 2
    with_world_size(argv, 1)          # the same command with --nproc_per_node 1
    reduced_points(segment)           # the loss the ranks trained on together, per step

How the restarts get M ranks: the launcher's own flag. The command's `--nproc_per_node N`
(or `--nproc-per-node N`, or either with `=N`: torchrun and `python -m
torch.distributed.run` spell it both ways) is replaced by M on every restart that finds a
checkpoint in its dir (a resume); a command without it is refused (exit 2), since the drill
cannot tell how the script would be given another world size. The reference, the crashed
run's first process and a restart with nothing to resume (a kill before the first
checkpoint) run at N.

Why bits cannot match: at another world size each rank holds another share of the global
batch and the all-reduce adds the ranks' gradients in another order (float addition is not
associative), so every step's weights differ in the last bits and the difference grows.
What is compared is the reduced loss: the mean of every rank's printed loss at a step (the
ranks' shares are equal, so that is the global batch's mean loss), or the run's trace when
the ranks do not say their rank (rank 0 printing the all-reduced loss).
"""

from __future__ import annotations

import re

from crashdrill.drill.target import Segment
from crashdrill.drill.trace import StepPoint

_FLAGS = ("--nproc_per_node", "--nproc-per-node")
# A restart that says why it will not resume on another world size (a per-rank checkpoint)
REFUSAL = re.compile(
    r"world[ _-]?size|\bwritten by \d+ ranks?|\branks?\b.*\b(differ|has|have)\b", re.I
)


def _flag_at(argv: list[str]) -> tuple[int, bool] | None:
    """(index of the launcher's --nproc_per_node, whether its value is in the same word)."""
    for i, a in enumerate(argv):
        name, eq, _ = a.partition("=")
        if name in _FLAGS:
            return i, bool(eq)
    return None


def launcher_world_size(argv: list[str]) -> int:
    """The ranks the command starts, from its --nproc_per_node; a ValueError saying what
    is needed when it has none (or not a number)."""
    at = _flag_at(argv)
    if at is None:
        raise ValueError(
            "--resume-world-size needs a launcher command whose ranks the drill can change: "
            "torchrun (or python -m torch.distributed.run) with --nproc_per_node N (or "
            f"--nproc-per-node N); found neither in {' '.join(argv)!r}"
        )
    i, joined = at
    value = argv[i].partition("=")[2] if joined else (argv[i + 1] if i + 1 < len(argv) else "")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"--resume-world-size: the command's {argv[i].partition('=')[0]} is {value!r}, not a "
            "number of ranks (auto, gpu and cpu are not supported: give a number)"
        )
    return int(value)


def with_world_size(argv: list[str], ranks: int) -> list[str]:
    """The command with its --nproc_per_node value replaced by `ranks`."""
    at = _flag_at(argv)
    if at is None:
        return list(argv)
    i, joined = at
    out = list(argv)
    if joined:
        out[i] = f"{argv[i].partition('=')[0]}={ranks}"
    else:
        out[i + 1] = str(ranks)
    return out


def reduced_points(seg: Segment) -> list[StepPoint]:
    """The reduced loss at each step: the mean of every rank's printed loss where the
    ranks print their own (steps that every rank printed), else the run's trace."""
    if not seg.rank_points:
        return list(seg.points)
    ranks = list(seg.rank_points.values())
    by_step: dict[int, list[StepPoint]] = {}
    for pts in ranks:
        for p in pts:
            by_step.setdefault(p.step, []).append(p)
    out = []
    for step, pts in by_step.items():
        if len(pts) == len(ranks):
            mean = sum(p.value for p in pts) / len(pts)
            out.append(StepPoint(step, repr(mean), mean, None, max(p.t for p in pts)))
    return sorted(out, key=lambda p: p.t)


def refused(seg: Segment) -> str | None:
    """The stderr line of a restart that exited non-zero saying the world size differs."""
    if not seg.crashed:
        return None
    return next((ln.strip() for ln in reversed(seg.stderr_tail) if REFUSAL.search(ln)), None)


def why_bits_differ(n: int, m: int) -> str:
    return (
        f"the reference ran at {n} rank(s), the restarts at {m}: each rank holds another share "
        "of the global batch and the all-reduce adds the ranks' gradients in another order "
        "(float addition is not associative), so the bits cannot match; the reduced loss (the "
        "mean of every rank's printed loss at a step, or the run's trace) is compared within "
        "--tolerance instead"
    )

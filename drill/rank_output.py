"""Which rank's output a multi-process script's steps are read from.

Under `torchrun --nproc_per_node N` every rank writes to the same stdout. The drill reads
every rank's steps, each rank's as a trace of its own (rank 0's, with the lines that say
no rank, is the run's trace: the kill plan and the loss comparison read it), or, with
`--rank R`, rank R's lines only. It knows a line's rank in two ways:

    [default1]:{"step": 5, "loss": 2.31}     torchrun's prefix (--tee, or a log-line template
    [rank1]:iter 5: loss 2.31                 such as TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)
    {"step": 5, "loss": 2.31, "rank": 1}     a JSON line's own "rank" key

A line with neither is taken as it is: most scripts print on rank 0 only.

    rank, text = split_rank("[default1]:iter 5: loss 2.31")    # (1, "iter 5: loss 2.31")
    line_of_rank(line, 0)                                      # rank 0's text, or None
"""

from __future__ import annotations

import json
import re

_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:\s?")
_RANK_KEY = re.compile(r'"rank"\s*:\s*(\d+)')


def split_rank(line: str) -> tuple[int | None, str]:
    """(the rank the line says it is from, the line without its rank prefix); None when
    it says no rank."""
    m = _PREFIX.match(line)
    if m:
        return int(m.group(1)), line[m.end() :]
    if '"rank"' in line and line.lstrip().startswith("{") and _RANK_KEY.search(line):
        try:
            obj = json.loads(line)
        except ValueError:
            return None, line
        rank = obj.get("rank") if isinstance(obj, dict) else None
        if isinstance(rank, int) and not isinstance(rank, bool):
            return rank, line
    return None, line


def line_of_rank(line: str, rank: int) -> str | None:
    """The line without its rank prefix when it is `rank`'s (or says no rank); None when
    it is another rank's."""
    m = _PREFIX.match(line)
    if m:
        if int(m.group(1)) != rank:
            return None
        line = line[m.end() :]
    if '"rank"' in line and line.lstrip().startswith("{"):
        key = _RANK_KEY.search(line)
        if key and int(key.group(1)) != rank:
            try:
                obj = json.loads(line)
            except ValueError:
                return line
            if isinstance(obj, dict) and obj.get("rank") != rank:
                return None
    return line


def ranks_read(only: int | None, printed: list[int]) -> dict[str, object]:
    """Which ranks' traces the drill compared, for the report: `only` is `--rank R` (None:
    every rank), `printed` the ranks whose lines said their rank and held steps in the
    reference run."""
    if only is not None:
        return {"mode": "one", "ranks": [only], "text": f"rank {only}'s lines only (--rank {only})"}
    if len(printed) < 2:
        return {"mode": "run", "ranks": printed, "text": "one trace (no two ranks printed steps)"}
    names = ", ".join(map(str, printed))
    return {
        "mode": "every",
        "ranks": printed,
        "text": f"{len(printed)} ranks compared, each its own trace ({names}); rank 0's is "
        "the run's trace",
    }

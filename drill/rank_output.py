"""Which rank's output a multi-process script's steps are read from.

Under `torchrun --nproc_per_node N` every rank writes to the same stdout. The drill reads
steps from one rank only (rank 0 unless `--rank R`), and knows a line's rank in two ways:

    [default1]:{"step": 5, "loss": 2.31}     torchrun's prefix (--tee, or a log-line template
    [rank1]:iter 5: loss 2.31                 such as TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)
    {"step": 5, "loss": 2.31, "rank": 1}     a JSON line's own "rank" key

A line with neither is taken as it is: most scripts print on rank 0 only.
"""

from __future__ import annotations

import json
import re

_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:\s?")
_RANK_KEY = re.compile(r'"rank"\s*:\s*(\d+)')


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

"""Steps from one rank of a multi-process script: torchrun's prefixes and a JSON "rank"."""

from __future__ import annotations

import pytest

from crashdrill.drill.rank_output import line_of_rank

NOTE = '{"note": "\\"rank\\": 1", "step": 2, "loss": 1.0}'


@pytest.mark.parametrize(
    ("line", "rank", "expected"),
    [
        ('{"step": 1, "loss": 2.5}', 0, '{"step": 1, "loss": 2.5}'),  # no rank: taken as is
        ('[default0]:{"step": 1, "loss": 2.5}', 0, '{"step": 1, "loss": 2.5}'),
        ('[default1]:{"step": 1, "loss": 2.5}', 0, None),
        ('[default1]:{"step": 1, "loss": 2.5}', 1, '{"step": 1, "loss": 2.5}'),
        ("[rank0]: iter 3: loss 1.25", 0, "iter 3: loss 1.25"),
        ("[rank12]:iter 3: loss 1.25", 1, None),
        ('{"step": 1, "loss": 2.5, "rank": 1}', 0, None),
        ('{"step": 1, "loss": 2.5, "rank": 0}', 0, '{"step": 1, "loss": 2.5, "rank": 0}'),
        ('{"step": 1, "loss": 2.5, "rank": 1}', 1, '{"step": 1, "loss": 2.5, "rank": 1}'),
        (NOTE, 0, NOTE),  # '"rank": 1' inside a string value is not the line's rank
        ("[12:00:01] step 4 loss 1.5", 0, "[12:00:01] step 4 loss 1.5"),  # a time, not a rank
    ],
)
def test_a_line_counts_only_for_its_own_rank(line: str, rank: int, expected: str | None) -> None:
    assert line_of_rank(line, rank) == expected

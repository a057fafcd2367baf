"""Steps of a multi-process script rank by rank: torchrun's prefixes and a JSON "rank",
one rank's lines (`--rank R`), and every rank's trace judged on its own."""

from __future__ import annotations

from typing import Any

import pytest

from crashdrill.drill.compare import analyse
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.rank_output import line_of_rank, split_rank
from crashdrill.drill.snapshot import Snapshot, dcp_dirs
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.trace import LossParser, StepPoint
from crashdrill.drill.verdicts import Analysis, Evidence

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


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[default1]:step 3 | loss 1.25", (1, "step 3 | loss 1.25")),
        ("[rank0]: iter 3: loss 1.25", (0, "iter 3: loss 1.25")),
        ('{"step": 1, "loss": 2.5, "rank": 2}', (2, '{"step": 1, "loss": 2.5, "rank": 2}')),
        (NOTE, (None, NOTE)),
        ("step 3 | loss 1.25", (None, "step 3 | loss 1.25")),
    ],
)
def test_a_line_says_its_rank_when_it_has_a_prefix_or_a_rank_key(
    line: str, expected: tuple[int | None, str]
) -> None:
    assert split_rank(line) == expected


# ---------------------------------------------------------------- every rank's trace

STEPS = range(1, 13)
CKPT: Snapshot = {"step-4/.metadata": (1, 9, 1)}


def _points(seg: Segment, rank: int, steps: range, off: dict[int, float]) -> list[StepPoint]:
    out = []
    for s in steps:
        v = 1.0 + 0.125 * rank + 0.01 * s + 1e-11 * s + off.get(s, 0.0)  # 17 digits
        out.append(StepPoint(s, repr(v), v, None, seg.started + 0.01 * s))
    return out


def _ranked(
    index: int, steps: range, off: dict[int, dict[int, float]] | None = None, **kw: Any
) -> Segment:
    """A segment of a 2-rank script whose ranks print their own losses; `off[rank][step]`
    moves one rank's loss at a step."""
    off = off or {}
    seg = Segment(index, ["torchrun"], None, started=10.0 * index)
    seg.rank_points = {r: _points(seg, r, steps, off.get(r, {})) for r in (0, 1)}
    seg.points = list(seg.rank_points[0])
    seg.killed = kw.get("killed", False)
    seg.exit_code = -9 if seg.killed else 0
    seg.kill_time = seg.points[-1].t + 0.001 if seg.killed else None
    seg.snapshot_before_kill = kw.get("before")
    seg.snapshot_first_step = {}
    seg.ended = seg.started + 1
    return seg


class _Target(Target):
    parser = LossParser()
    timeout = 10.0


def _judge(crashed: list[Segment]) -> Analysis:
    ref = _ranked(0, STEPS)
    plan = [KillPoint(s.last_step or 0) for s in crashed if s.killed]
    return analyse(Evidence(_Target(), ref, CKPT, crashed, plan))


def test_a_rank_that_differs_first_while_rank_0_matches_is_named() -> None:
    # Rank 1 restored rank 0's RNG: its first recomputed loss (step 5) differs; rank 0's
    # only from the next step on (the averaged update differs).
    an = _judge(
        [
            _ranked(0, range(1, 7), killed=True, before=CKPT),
            _ranked(1, range(5, 13), off={1: {5: 0.5, 6: 0.1}, 0: {6: 0.2}}),
        ]
    )
    assert an.verdict == "fail"
    (r,) = an.resumes
    rank = r.first_divergent_rank
    assert rank is not None and (rank.rank, rank.step, rank.ranks) == (1, 5, 2)
    assert r.verdict == "diverged at step 5"
    codes = [f.code for f in an.findings if f.fails]
    assert codes == ["rank-state"], an.findings
    assert "differs on rank 1 while the other ranks' match" in an.findings[0].text


def test_every_rank_s_trace_matching_passes() -> None:
    an = _judge([_ranked(0, range(1, 7), killed=True, before=CKPT), _ranked(1, range(5, 13))])
    assert an.verdict == "pass", an.findings
    (r,) = an.resumes
    assert r.bit_identical and r.first_divergent_rank is None
    assert [f.field for f in r.fields] == [
        "step.loss",
        "step.rank_loss_bits.0",
        "step.rank_loss_bits.1",
    ]


def test_ranks_that_differ_at_the_same_step_are_not_one_rank_s_state() -> None:
    an = _judge(
        [
            _ranked(0, range(1, 7), killed=True, before=CKPT),
            _ranked(1, range(5, 13), off={0: {5: 0.5}, 1: {5: 0.5}}),
        ]
    )
    assert "rank-state" not in [f.code for f in an.findings]
    assert an.verdict == "fail"


def test_a_rank_that_differs_before_any_kill_is_nondeterminism() -> None:
    an = _judge(
        [
            _ranked(0, range(1, 7), killed=True, off={1: {2: 0.5}}, before=CKPT),
            _ranked(1, range(5, 13)),
        ]
    )
    assert "nondeterministic" in [f.code for f in an.findings]


# ---------------------------------------------------------------- DCP dirs


def test_a_dcp_dir_is_complete_only_with_its_metadata() -> None:
    snap: Snapshot = {
        "step-4/.metadata": (1, 9, 1),
        "step-4/__0_0.distcp": (2, 9, 1),
        "step-8/__0_0.distcp": (3, 9, 1),
        "tmp-step-12/__0_0.distcp": (4, 9, 1),  # a temp dir: a write under way, not a dir
        "log.csv": (5, 9, 1),
    }
    assert dcp_dirs(snap) == {"step-4": True, "step-8": False}


def _resume_from(step_8: Snapshot) -> Analysis:
    killed = _ranked(0, range(1, 10), killed=True, before=CKPT)
    restart = _ranked(1, range(9, 13))  # resumed from step 8
    restart.snapshot_start = {**CKPT, "step-4/__0_0.distcp": (2, 9, 1), **step_8}
    return _judge([killed, restart])


def test_a_restart_that_resumed_from_a_dcp_dir_without_its_metadata_is_a_finding() -> None:
    an = _resume_from({"step-8/__0_0.distcp": (3, 9, 1), "step-8/__1_0.distcp": (4, 9, 1)})
    found = [f for f in an.findings if f.code == "dcp-incomplete"]
    assert found and found[0].fails and an.verdict == "fail"
    assert "step-8/ held DCP shards but no .metadata" in found[0].text
    assert "step-8/__0_0.distcp" in found[0].evidence[-1]


def test_a_restart_from_a_complete_dcp_dir_is_no_finding() -> None:
    an = _resume_from({"step-8/__0_0.distcp": (3, 9, 1), "step-8/.metadata": (4, 9, 1)})
    assert "dcp-incomplete" not in [f.code for f in an.findings] and an.verdict == "pass"

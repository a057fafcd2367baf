"""The drill's diagnosis with `crashdrill inspect` as evidence: a resume that diverges at
once names what the checkpoint lacks (a weights-only checkpoint's missing optimizer state
is named, not only "RNG state or data position"), and a drill that passes reads nothing."""

from __future__ import annotations

from pathlib import Path

import torch

from crashdrill.drill.checkpoint_evidence import CheckpointLook
from tests.unit.test_drill_compare import CKPT as SNAP
from tests.unit.test_drill_compare import REF, _analyse, _codes, _seg


def diverged_at_once() -> list:  # type: ignore[type-arg]
    return [
        _seg(0, range(1, 23), killed=True, before=SNAP),
        _seg(1, range(16, 41), values={s: REF[s - 1] + 0.05 for s in range(16, 41)}),
    ]


def test_a_weights_only_checkpoint_gets_its_missing_optimizer_named(tmp_path: Path) -> None:
    torch.save({"model": torch.nn.Linear(3, 1).state_dict(), "step": 15}, tmp_path / "ckpt.pt")
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    assert _codes(an) == ["state-missing"]
    text = an.findings[0].text
    assert "RNG state or the data position." in text  # what the trace says, then the files
    assert "(ckpt.pt, torch.save): it lacks optimizer state, RNG states, data position." in text


def test_a_checkpoint_that_holds_everything_points_at_the_restore(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    full = {"m": model.state_dict(), "o": opt.state_dict(), "rng": torch.get_rng_state()}
    torch.save({**full, "sampler": {"cursor": 4}, "step": 15}, tmp_path / "ckpt.pt")
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    assert "suspect how it restores it" in an.findings[0].text, an.findings[0].text


def test_a_passing_drill_never_opens_the_checkpoint(tmp_path: Path) -> None:
    look = CheckpointLook(tmp_path / "never-read")
    an = _analyse(
        [_seg(0, range(1, 23), killed=True, before=SNAP), _seg(1, range(16, 41))],
        checkpoint=look,
    )
    assert an.verdict == "pass" and look.error is None and not look._done


def test_an_unreadable_checkpoint_leaves_the_finding_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "ckpt.json").write_text('{"step": 1')  # torn
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    assert an.findings[0].text.endswith("the RNG state or the data position")


def test_a_checkpoint_of_plain_numbers_is_not_said_to_lack_what_it_may_hold(
    tmp_path: Path,
) -> None:
    (tmp_path / "ckpt.json").write_text('{"step": 15, "w": [0.5, 1.0], "vw": [0.1, 0.2]}')
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    text = an.findings[0].text
    assert "(ckpt.json, json): it holds no model tensors, so state kept as plain" in text, text

"""The drill's diagnosis with `crashdrill inspect` as evidence: a resume that diverges at
once names what the checkpoint lacks (a weights-only checkpoint's missing optimizer state
is named, not only "RNG state or data position"), and a drill that passes reads nothing."""

from __future__ import annotations

from pathlib import Path

import torch

from crashdrill.drill.checkpoint_evidence import CheckpointLook
from crashdrill.drill.target import Segment
from tests.unit.test_drill_compare import CKPT as SNAP
from tests.unit.test_drill_compare import REF, _analyse, _codes, _seg


def diverged_at_once() -> list[Segment]:
    return [
        _seg(0, range(1, 23), killed=True, before=SNAP),
        _seg(1, range(16, 41), values={s: REF[s - 1] + 0.05 for s in range(16, 41)}),
    ]


def test_a_weights_only_checkpoint_gets_its_missing_optimizer_named(tmp_path: Path) -> None:
    torch.save({"model": torch.nn.Linear(3, 1).state_dict(), "step": 15}, tmp_path / "ckpt.pt")
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    assert _codes(an) == ["state-missing"]
    text = an.findings[0].text
    assert "the batch or the weights differ — a weights-only checkpoint: the optimizer" in text
    # The optimizer first; no data position: a key name would be all that could show one
    lacks = "it lacks optimizer state (momentum or Adam moments, step counts), RNG states."
    assert f"(ckpt.pt, torch.save): {lacks}" in text, text


def test_a_checkpoint_that_holds_everything_points_at_the_restore(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    full = {"m": model.state_dict(), "o": opt.state_dict(), "rng": torch.get_rng_state()}
    torch.save({**full, "sampler": {"cursor": 4}, "step": 15}, tmp_path / "ckpt.pt")
    an = _analyse(diverged_at_once(), checkpoint=CheckpointLook(tmp_path))
    assert _codes(an) == ["saved-not-restored"]
    text = an.findings[0].text
    assert "although the checkpoint holds that state: saved but not restored" in text, text
    assert "finds RNG states (torch CPU generator state (5056 bytes)), optimizer state" in text
    assert "lacks" not in text  # a key named `sampler` is no evidence either way


def test_optimizer_state_in_the_checkpoint_and_a_different_update_is_saved_not_restored(
    tmp_path: Path,
) -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"m": model.state_dict(), "o": opt.state_dict()}, tmp_path / "ckpt.pt")
    values = {s: REF[s - 1] + (0.05 if s > 16 else 0) for s in range(16, 41)}
    segs = [_seg(0, range(1, 23), killed=True, before=SNAP), _seg(1, range(16, 41), values=values)]
    an = _analyse(segs, checkpoint=CheckpointLook(tmp_path))
    assert _codes(an) == ["saved-not-restored"], an.findings
    text = an.findings[0].text
    assert "step 17 differs" in text and "finds optimizer state (Adam-style" in text, text
    assert "it lacks RNG states" in text and "does not put back the optimizer state" in text


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

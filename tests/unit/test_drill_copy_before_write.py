"""The drill's copy of a running script's checkpoint dir before a write it aims a kill at
(drill/engine.py _copy_before_write): a file renamed or removed while it is copied (a DCP
write renaming its `.metadata.tmp`) drops that copy and keeps the last good one; the drill
goes on (CI saw it end with shutil.Error and no report)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from crashdrill.drill import engine
from crashdrill.drill.target import Segment, Target


def test_a_file_renamed_under_the_copy_keeps_the_last_good_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-4").mkdir(parents=True)
    (ckpt / "step-4" / "model.pt").write_bytes(b"weights")
    target, seg = Target(), Segment(index=1, argv=["x"], kill_point=None, started=0.0)
    dest = tmp_path / "copies" / "before-segment-1"
    engine._copy_before_write(target, ckpt, dest, seg, 4)
    assert seg.state_copy == dest and seg.copy_step == 4
    assert (dest / "step-4" / "model.pt").read_bytes() == b"weights"

    (ckpt / "tmp-step-8").mkdir()
    (ckpt / "tmp-step-8" / ".metadata.tmp").write_bytes(b"half")
    real = shutil.copytree

    def renamed_meanwhile(src: Any, dst: Any, **kw: Any) -> Any:
        (ckpt / "tmp-step-8").rename(ckpt / "step-8")  # the write ends under the copy
        return real(ckpt / "tmp-step-8", dst, **kw)

    monkeypatch.setattr(engine.shutil, "copytree", renamed_meanwhile)
    engine._copy_before_write(target, ckpt, dest, seg, 8)
    assert seg.state_copy == dest and seg.copy_step == 4  # the last good one stays
    assert sorted(p.name for p in dest.iterdir()) == ["step-4"]
    assert not dest.with_name(dest.name + "-taking").exists()

    monkeypatch.setattr(engine.shutil, "copytree", real)
    engine._copy_before_write(target, ckpt, dest, seg, 9)  # the next line tries again
    assert seg.copy_step == 9 and sorted(p.name for p in dest.iterdir()) == ["step-4", "step-8"]

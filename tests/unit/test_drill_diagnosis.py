"""Diagnoses that are true (issue 33 §3), on hand-made evidence: a restart that loaded the
weights and counted from 0 again is said to be that, not a fresh start; each note is said
only with the evidence that backs it; a passing drill that saw checkpoints written under
their final names says which trial it did not exercise."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashdrill.drill.checkpoint_evidence import CheckpointLook
from crashdrill.drill.checkpoint_inspect import inventory
from crashdrill.drill.compare import analyse
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.snapshot import Snapshot
from crashdrill.drill.target import Segment
from crashdrill.drill.verdicts import Analysis, Evidence
from crashdrill.drill.write_evidence import WriteObserver, incomplete_proof, looks_like_checkpoint
from tests.unit.test_drill_compare import CKPT, REF, FakeTarget, _analyse, _codes, _ref, _seg


def test_a_restart_that_counts_from_1_again_with_a_fresh_start_s_loss_is_a_silent_fresh_start() -> (
    None
):
    an = _analyse([_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(1, 41))])
    assert _codes(an) == ["silent-fresh-start"], an.findings
    assert "its first loss is a fresh start's" in an.findings[0].text


def test_a_restart_that_counts_from_1_again_from_loaded_weights_says_exactly_that() -> None:
    trained = {s: REF[s - 1] - 0.2 for s in range(1, 41)}  # better than a fresh start's
    an = _analyse(
        [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(1, 41), values=trained)]
    )
    assert _codes(an) == ["steps-restarted"], an.findings
    f = an.findings[0]
    assert "it loaded the weights and started counting steps from 1 again" in f.text, f.text
    assert any("printed step 1 again with loss" in e for e in f.evidence), f.evidence
    assert an.resumes[0].verdict == "steps restarted from 1" and an.exit_code == 1


def _planned(segs: list[Segment], plan: list[KillPoint]) -> Analysis:
    return analyse(Evidence(FakeTarget(), _ref(), CKPT, segs, plan))


def test_a_kill_re_planned_after_a_restart_that_crashed_is_not_a_missed_kill() -> None:
    k1, k2 = KillPoint(10), KillPoint(30)
    first = _seg(0, range(1, 11), killed=True, before=CKPT)
    crashed = _seg(1, range(9, 12), exit_code=1)  # armed with k2, crashed at step 11
    again = _seg(2, range(9, 31), killed=True, before=CKPT)  # k2 re-planned: it landed here
    last = _seg(3, range(25, 41))
    for seg, kp in ((first, k1), (crashed, k2), (again, k2)):
        seg.kill_point = kp
    an = _planned([first, crashed, again, last], [k1, k2])
    assert "kill-missed" not in _codes(an), an.findings


def test_a_kill_the_run_finished_before_is_missed_with_the_step_it_ended_at() -> None:
    k1, k2 = KillPoint(10), KillPoint(45)
    first = _seg(0, range(1, 11), killed=True, before=CKPT)
    last = _seg(1, range(9, 41))
    first.kill_point, last.kill_point = k1, k2
    an = _planned([first, last], [k1, k2])
    missed = [f for f in an.findings if f.code == "kill-missed"]
    assert missed and not missed[0].fails and an.verdict == "pass", an.findings
    assert missed[0].evidence == ["the process armed with the kill at step 45 exited 0 at step 40"]


NEW_FILE: Snapshot = {**CKPT, "epoch=1-step=22.ckpt": (7, 900, 99)}


def test_a_new_complete_file_beside_the_one_the_restart_loads_gets_no_incomplete_note() -> None:
    # Lightning: the kill landed after epoch=1-step=22.ckpt was written and before
    # last.ckpt was updated; the restart resumed from last.ckpt (step 16), as it should.
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=NEW_FILE),
        _seg(1, range(17, 41)),
    ]
    an = _analyse(segs)
    assert "incomplete-skipped" not in _codes(an) and an.verdict == "pass", an.findings


def test_a_skipped_dir_that_lacks_files_a_complete_one_holds_is_noted_with_that_evidence() -> None:
    before: Snapshot = {
        "checkpoint-16/model.pt": (1, 9, 1),
        "checkpoint-16/optimizer.pt": (2, 9, 1),
    }
    after: Snapshot = {**before, "checkpoint-22/model.pt": (3, 9, 2)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=before, after=after),
        _seg(1, range(17, 41)),
    ]
    an = _analyse(segs)
    assert _codes(an) == ["incomplete-skipped"], an.findings
    proof = "checkpoint-22/ lacks optimizer.pt, which checkpoint-16/ holds (before the kill)"
    assert proof in an.findings[0].evidence, an.findings[0].evidence


def test_a_file_shorter_than_the_reference_s_of_that_name_was_cut_short() -> None:
    said = incomplete_proof(
        ["ckpt_22.pt"], {}, {"ckpt_22.pt": (1, 10, 1)}, {"ckpt_22.pt": (5, 99, 1)}
    )
    assert said == ["ckpt_22.pt was 10 bytes, the reference's 99: cut short"]
    assert incomplete_proof(["ckpt_22.pt"], {}, {"ckpt_22.pt": (1, 99, 1)}, {}) == []


def test_checkpoint_content_is_told_from_a_log_by_its_first_bytes(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04rest")
    (tmp_path / "events.out.tfevents.1").write_bytes(b"\x18\x00\x00\x00 log")
    (tmp_path / "trainer_state.json").write_text('{"global_step": 8}')
    (tmp_path / "log.json").write_text('{"a": 1}\n{"a": 2}\n')
    assert looks_like_checkpoint(tmp_path / "model.pt")
    assert looks_like_checkpoint(tmp_path / "trainer_state.json")
    assert not looks_like_checkpoint(tmp_path / "events.out.tfevents.1")
    assert not looks_like_checkpoint(tmp_path / "log.json")  # JSON lines: a log


def fill(folder: Path, name: str) -> None:
    """The folder made and one checkpoint-looking file written into it."""
    folder.mkdir()
    (folder / name).write_bytes(b"PK\x03\x04")


def _watched(root: Path, steps: list[Callable[[], object]]) -> list[str]:
    watch = WriteObserver(root)
    now = time.monotonic()
    for i, step in enumerate([lambda: None, *steps]):
        step()
        watch.poll(now + i)  # one poll per change
    return watch.sentences()


def test_a_dir_filled_in_under_its_final_name_is_seen_and_a_renamed_one_is_not(
    tmp_path: Path,
) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    seen = _watched(
        hf,
        [
            lambda: fill(hf / "checkpoint-8", "model.pt"),
            lambda: (hf / "checkpoint-8/optimizer.pt").write_bytes(b"PK\x03\x04"),
        ],
    )
    assert seen == [
        "checkpoint-8/ was filled in under its final name (first seen with 1 file(s), later 2)"
    ]
    atomic = tmp_path / "atomic"
    atomic.mkdir()
    tmp = atomic / "tmp-checkpoint-8"

    def write() -> None:
        tmp.mkdir()
        (tmp / "model.pt").write_bytes(b"PK\x03\x04")
        (tmp / "optimizer.pt").write_bytes(b"PK\x03\x04")

    assert _watched(atomic, [write, lambda: tmp.rename(atomic / "checkpoint-8")]) == []


def test_a_checkpoint_rewritten_in_place_is_seen_and_a_growing_log_is_not(tmp_path: Path) -> None:
    ckpt, log = tmp_path / "model.pt", tmp_path / "events.out.tfevents.1"
    ckpt.write_bytes(b"PK\x03\x04" + b"0" * 10)
    log.write_bytes(b"\x18\x00")

    def step() -> None:
        with ckpt.open("r+b") as f:
            f.write(b"PK\x03\x04" + b"1" * 20)
        with log.open("ab") as f:
            f.write(b"more")

    assert _watched(tmp_path, [step]) == ["model.pt grew or changed in place under its final name"]


def _passed_with_writes_in_place(plan: list[KillPoint]) -> Analysis:
    ref = _ref()
    ref.writes_in_place = ["checkpoint-8/ was filled in under its final name"]
    segs = [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 41))]
    segs[0].kill_point = plan[0]
    return analyse(Evidence(FakeTarget(), ref, CKPT, segs, plan))


def test_a_drill_that_passed_without_a_kill_inside_an_in_place_write_says_which_trial_would() -> (
    None
):
    an = _passed_with_writes_in_place([KillPoint(22)])
    assert an.verdict == "pass" and _codes(an) == ["non-atomic-write"], an.findings
    note = an.findings[0]
    assert not note.fails and "rerun with --kills 2 or more" in note.text, note.text
    assert note.evidence == [
        "in the reference run, checkpoint-8/ was filled in under its final name"
    ]
    an = _passed_with_writes_in_place([KillPoint(22, during_write=True)])
    assert "rerun with another --seed, or with --kills 10" in an.findings[0].text


def _look(tree: dict[str, Any]) -> CheckpointLook:
    """A CheckpointLook whose inspect already ran on a checkpoint of this skeleton."""
    look = CheckpointLook(Path("/ckpt"))
    desc = {"path": "/ckpt", "format": "torch.save", "files": [{"name": "m.pt", "tree": tree}]}
    look._done, look._inv = True, inventory(desc)
    return look


WEIGHTS = {"dict": {"w": {"tensor": "float32", "shape": [3]}}}


def test_a_weights_only_checkpoint_names_the_optimizer_first_at_either_step() -> None:
    code, text = _look(WEIGHTS).explain("update")
    assert code == "state-missing", text
    assert text.startswith("the update differs — a weights-only checkpoint: the optimizer state")
    code, text = _look(WEIGHTS).explain("batch")
    assert "(momentum or Adam moments, step counts) and the RNG state are not saved" in text


def test_a_key_named_like_a_data_position_is_no_evidence_either_way() -> None:
    tree = {"dict": {"model": WEIGHTS, "data": {"v": 12}, "sampler": {"dict": {"i": {"v": 3}}}}}
    look = _look(tree)
    assert "data" not in look.lacking() and "data" not in look.holding()
    _, text = look.explain("batch")
    assert "data position is not recognisable by its content" in text, text

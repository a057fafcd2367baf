"""Where a kill landed, judged from evidence (issue #26 item 2), on hand-made segments."""

from __future__ import annotations

from crashdrill.drill.snapshot import Snapshot
from tests.unit.test_drill_compare import CKPT, REF, _analyse, _codes, _ref, _seg

IN_PLACE: Snapshot = {"ckpt.json": (1, 120, 99)}  # same inode, rewritten


def test_a_write_kill_whose_restart_resumes_from_the_step_being_written_is_a_plain_kill() -> None:
    off = {s: REF[s - 1] + 0.05 for s in range(23, 41)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=IN_PLACE),
        _seg(1, range(23, 41), values=off),  # resumed from 22: the write had finished
    ]
    an = _analyse(segs)
    assert _codes(an) == ["in-place-write", "state-missing"], an.findings
    r = an.resumes[0]
    assert not r.kill_in_write and r.trial == "after-checkpoint" and r.recomputed is None
    assert "after the checkpoint write had finished" in r.kill_where
    note, missing = an.findings
    assert not note.fails and "nothing was torn" in note.text
    assert "no step was recomputed" in missing.text and "recomputed loss" not in missing.text
    assert any("the step being written" in e for e in missing.evidence)


def test_a_write_kill_counts_as_inside_when_its_temp_file_was_still_there() -> None:
    with_temp: Snapshot = {**CKPT, "ckpt.json.tmp": (7, 40, 99)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=with_temp),
        _seg(1, range(17, 41)),  # an atomic writer: the older checkpoint loads
    ]
    an = _analyse(segs)
    assert an.verdict == "pass" and an.resumes[0].kill_in_write, an.findings
    assert an.resumes[0].trial == "inside-write"
    assert any("temp name" in e for e in an.resumes[0].kill_evidence)


def test_a_changed_dir_alone_does_not_put_a_plain_kill_inside_a_write() -> None:
    segs = [_seg(0, range(1, 23), killed=True, before=CKPT, after=CKPT), _seg(1, range(23, 41))]
    an = _analyse(segs)
    assert an.verdict == "pass" and not an.resumes[0].kill_in_write
    assert an.resumes[0].kill_where == "between checkpoint writes"


def test_a_restart_that_trained_before_it_crashed_loaded_an_older_checkpoint() -> None:
    partial: Snapshot = {**CKPT, "checkpoint-22/config.json": (9, 2, 99)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=partial),
        _seg(1, range(9, 12), exit_code=1),
    ]
    an = _analyse(segs)
    r = an.resumes[0]
    assert r.kill_in_write and r.from_step == 8
    assert any("older than the step being written (22)" in e for e in r.kill_evidence)
    assert not any("failed to load" in e for e in r.kill_evidence)
    assert "torn-checkpoint" in _codes(an)


def test_a_resume_after_a_diverged_one_is_judged_against_the_killed_process() -> None:
    off = {s: REF[s - 1] + 0.05 for s in range(16, 41)}
    segs = [
        _seg(0, range(1, 23), killed=True, before=CKPT),
        _seg(1, range(16, 31), values=off, killed=True, before=CKPT),
        _seg(2, range(26, 41), values=off),  # recomputes 26-30 as the killed process did
    ]
    an = _analyse(segs)
    first, second = an.resumes
    assert first.compared_with == "reference" and first.first_divergent_step == 16
    assert second.compared_with == "killed process" and second.first_divergent_step is None
    assert [f.resume for f in an.findings] == [1], an.findings


def test_a_step_printed_past_a_finished_write_does_not_make_the_resume_older_than_it() -> None:
    # Lightning: the epoch-end checkpoint "step=16" is written, the next epoch prints step
    # 17, then the kill aimed at the write takes effect. The restart resumes from 16, the
    # step that was being written (the reference wrote after 8, 16, 24 and 32): the write
    # had finished, and the loss that differs is the script's own (RNG) bug, not a tear.
    partial: Snapshot = {**CKPT, "epoch=3-step=16.ckpt": (9, 2, 99)}
    off = {s: REF[s - 1] + 0.05 for s in range(17, 41)}
    ref = _ref()
    ref.write_steps = [8, 16, 24, 32]
    segs = [
        _seg(0, range(1, 18), killed=True, in_write=True, before=CKPT, after=partial),
        _seg(1, range(17, 41), values=off),
    ]
    an = _analyse(segs, ref)
    r = an.resumes[0]
    assert not r.kill_in_write and r.trial == "after-checkpoint", r.kill_evidence
    assert any("the step being written" in e for e in r.kill_evidence), r.kill_evidence
    assert "torn-checkpoint" not in _codes(an) and "state-missing" in _codes(an), an.findings


def test_an_incomplete_new_checkpoint_the_restart_skipped_is_a_note_not_the_divergence() -> None:
    # torchrun + DCP saving the model only: the kill lands inside the write of step-22/
    # (its .metadata still a temp file); the restart skips the incomplete dir and loads
    # step 16's, intact. The first step after it differs because the optimizer state is
    # missing: that is the finding, and the incomplete dir is a note, not a tear.
    partial: Snapshot = {
        **CKPT,
        "step-22/__0_0.distcp": (9, 2, 99),
        "step-22/.metadata.tmp": (10, 1, 99),
    }
    off = {s: REF[s - 1] + 0.05 for s in range(17, 41)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=partial),
        _seg(1, range(17, 41), values=off),
    ]
    an = _analyse(segs)
    r = an.resumes[0]
    assert r.kill_in_write and r.trial == "inside-write", r.kill_evidence
    assert "torn-checkpoint" not in _codes(an), an.findings
    assert _codes(an) == ["incomplete-skipped", "state-missing"], an.findings
    note = an.findings[0]
    assert not note.fails and "skipped it" in note.text and "step 16" in note.text


def test_a_restart_from_the_start_that_loaded_the_weights_proves_the_write_had_finished() -> None:
    # A weights-only script: it loads the weights and counts from 1 again. Its first loss is
    # not a fresh start's, so the checkpoint it loaded was whole: no torn write, steps restarted.
    loaded = {s: REF[s - 1] - 0.5 for s in range(1, 41)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, first={}, before=CKPT, after=IN_PLACE),
        _seg(1, range(1, 41), values=loaded),
    ]
    an = _analyse(segs)
    assert "steps-restarted" in _codes(an) and "torn-checkpoint" not in _codes(an), an.findings
    r = an.resumes[0]
    assert not r.kill_in_write
    assert any("its first loss is not a fresh start's" in e for e in r.kill_evidence)
    # The same restart printing a fresh start's losses: then the write was torn.
    fresh = [segs[0], _seg(1, range(1, 41))]
    assert "torn-checkpoint" in _codes(_analyse(fresh))

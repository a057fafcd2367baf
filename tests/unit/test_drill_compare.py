"""Resume checks and diagnosis on hand-made evidence (no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashdrill.drill.compare import analyse
from crashdrill.drill.plan import KillPoint
from crashdrill.drill.snapshot import Snapshot, modified_in_place, scan
from crashdrill.drill.target import Segment, Target
from crashdrill.drill.trace import LossParser, StepPoint
from crashdrill.drill.verdicts import Analysis, Evidence, FinalParams

REF = [round(3.0 - 0.01 * s, 10) + 1e-11 * s for s in range(1, 41)]  # 17-digit losses
CKPT: Snapshot = {"ckpt.json": (1, 100, 10)}
CKPT_LATER: Snapshot = {"ckpt.json": (2, 100, 20)}


class FakeTarget(Target):
    parser = LossParser()
    timeout = 10.0


def _seg(
    index: int,
    steps: range,
    *,
    values: dict[int, float] | None = None,
    killed: bool = False,
    exit_code: int | None = 0,
    in_write: bool = False,
    before: Snapshot | None = None,
    after: Snapshot | None = None,
    first: Snapshot | None = None,
    text: str = "{!r}",
) -> Segment:
    values = values or {}
    seg = Segment(index, ["train"], None, started=10.0 * index)
    for j, s in enumerate(steps):
        v = values.get(s, REF[s - 1])
        t = seg.started + 1 + 0.01 * j
        seg.points.append(StepPoint(s, text.format(v), float(text.format(v)), None, t))
    seg.killed, seg.exit_code, seg.in_write = killed, -9 if killed else exit_code, in_write
    seg.kill_time = seg.points[-1].t + 0.001 if killed and steps else None
    seg.snapshot_before_kill, seg.snapshot_after_kill = before, after
    seg.snapshot_first_step = first or {}
    seg.ended = seg.started + 1
    return seg


def _ref(text: str = "{!r}") -> Segment:
    return _seg(0, range(1, 41), text=text)


def _analyse(crashed: list[Segment], ref: Segment | None = None, **kw: Any) -> Analysis:
    plan = [KillPoint(s.last_step or 0) for s in crashed if s.killed]
    ev = Evidence(FakeTarget(), ref or _ref(), CKPT, crashed, plan, **kw)
    return analyse(ev)


def _codes(an: Analysis) -> list[str]:
    return [f.code for f in an.findings]


def test_identical_resumes_pass_with_their_ranges_and_latency() -> None:
    an = _analyse(
        [
            _seg(0, range(1, 4), killed=True, before={}),
            _seg(1, range(1, 23), killed=True, before=CKPT),
            _seg(2, range(16, 41)),
        ]
    )
    assert an.verdict == "pass" and an.exit_code == 0 and not an.findings
    r1, r2 = an.resumes
    assert (r1.killed_at_step, r1.from_step, r1.recomputed) == (3, None, (1, 3))  # from scratch
    assert r1.bit_identical and r1.restarted_from_start and not r1.progress_saved
    assert (r2.from_step, r2.recomputed, r2.recomputed_steps, r2.points) == (15, (16, 22), 7, 25)
    assert r2.max_abs_delta == 0 and r2.first_divergent_step is None
    assert r2.latency_s is not None and 0 < r2.latency_s < 10


def test_first_recomputed_loss_differs_means_rng_or_data_state_missing() -> None:
    an = _analyse(
        [
            _seg(0, range(1, 23), killed=True, before=CKPT),
            _seg(1, range(16, 41), values={s: REF[s - 1] + 0.05 for s in range(16, 41)}),
        ]
    )
    assert an.exit_code == 1 and _codes(an) == ["state-missing"]
    assert "RNG state or the data position" in an.findings[0].text
    assert an.resumes[0].first_divergent_step == 16 and an.resumes[0].divergent_offset == 0


def test_second_recomputed_loss_differs_means_optimizer_state_missing() -> None:
    an = _analyse(
        [
            _seg(0, range(1, 23), killed=True, before=CKPT),
            _seg(1, range(16, 41), values={s: REF[s - 1] + 0.03 for s in range(17, 41)}),
        ]
    )
    assert _codes(an) == ["state-missing"] and "optimizer state" in an.findings[0].text


def test_tiny_or_late_divergence_means_nondeterminism() -> None:
    late = {s: REF[s - 1] + 1e-6 * (s - 25) for s in range(26, 41)}
    an = _analyse(
        [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 41), values=late)]
    )
    assert _codes(an) == ["nondeterministic"] and "thread count" in an.findings[0].text
    tiny = {s: REF[s - 1] * (1 + 1e-7) for s in range(16, 41)}
    an = _analyse(
        [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 41), values=tiny)]
    )
    assert _codes(an) == ["nondeterministic"]


def test_a_difference_before_any_kill_is_reported_once_as_nondeterminism() -> None:
    noisy = {s: REF[s - 1] + 1e-9 for s in range(1, 41)}
    an = _analyse(
        [
            _seg(0, range(1, 23), killed=True, before=CKPT, values=noisy),
            _seg(1, range(16, 41), values=noisy),
        ]
    )
    assert _codes(an) == ["nondeterministic"] and "before any kill" in an.findings[0].text


def test_going_back_to_the_start_with_a_checkpoint_is_a_silent_fresh_start() -> None:
    an = _analyse([_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(1, 41))])
    assert _codes(an) == ["silent-fresh-start"] and an.resumes[0].verdict == "silent fresh start"
    assert not an.resumes[0].bit_identical


def test_going_back_to_the_start_before_any_checkpoint_is_fine() -> None:
    ref = _ref()
    ref.first_ckpt_step = 5  # the reference wrote its first checkpoint after step 5
    an = _analyse([_seg(0, range(1, 4), killed=True, before={}), _seg(1, range(1, 41))], ref=ref)
    assert an.verdict == "pass" and an.resumes[0].restarted_from_start


def test_checkpoints_written_only_at_the_end_lose_every_kill() -> None:
    ref = _ref()  # its dir holds a checkpoint at the end; none appeared while it ran
    an = _analyse([_seg(0, range(1, 23), killed=True, before={}), _seg(1, range(1, 41))], ref=ref)
    assert _codes(an) == ["never-checkpoints"] and "only when it finished" in an.findings[0].text


def test_a_first_process_that_crashes_before_any_kill_fails() -> None:
    seg = _seg(0, range(1, 10), exit_code=1)
    seg.stderr_tail = ["MemoryError"]
    an = _analyse([seg])
    assert _codes(an) == ["crashed"] and "MemoryError" in an.findings[0].text


def test_no_checkpoint_anywhere_fails_even_when_the_trace_matches() -> None:
    segs = [_seg(0, range(1, 23), killed=True, before={}), _seg(1, range(1, 41))]
    an = analyse(Evidence(FakeTarget(), _ref(), {}, segs, [KillPoint(22)]))
    assert an.exit_code == 1 and _codes(an) == ["never-checkpoints"]


def test_a_crash_after_an_in_place_write_kill_is_a_torn_checkpoint() -> None:
    torn: Snapshot = {"ckpt.json": (1, 3, 99)}  # same inode, truncated
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=torn),
        _seg(1, range(0), exit_code=1),
    ]
    segs[1].stderr_tail = ["json.decoder.JSONDecodeError: Expecting value"]
    an = _analyse(segs)
    assert _codes(an) == ["torn-checkpoint"] and "ckpt.json" in an.findings[0].text
    assert "JSONDecodeError" in an.findings[0].text and an.resumes[0].verdict == "crashed"


def test_a_crash_after_an_atomic_write_kill_is_just_a_crash() -> None:
    replaced: Snapshot = {"ckpt.json": (1, 100, 10), "ckpt.json.tmp": (5, 3, 99)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=replaced),
        _seg(1, range(0), exit_code=1),
    ]
    assert _codes(_analyse(segs)) == ["crashed"]


def test_divergence_after_an_in_place_write_kill_is_a_torn_checkpoint() -> None:
    torn: Snapshot = {"ckpt.json": (1, 50, 99)}
    off = {s: REF[s - 1] + 0.1 for s in range(16, 41)}
    segs = [
        _seg(0, range(1, 23), killed=True, in_write=True, before=CKPT, after=torn),
        _seg(1, range(16, 41), values=off),
    ]
    assert _codes(_analyse(segs)) == ["torn-checkpoint"]


def test_a_restart_that_prints_no_step_is_diagnosed_as_hung() -> None:
    segs = [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 20), exit_code=-9)]
    segs[1].hung = True
    an = _analyse(segs)
    assert _codes(an) == ["hung"] and "within 10 s" in an.findings[0].text


def test_too_few_digits_fails_even_when_everything_matches() -> None:
    ref = _ref(text="{:.4f}")
    segs = [
        _seg(0, range(1, 23), killed=True, before=CKPT, text="{:.4f}"),
        _seg(1, range(16, 41), text="{:.4f}"),
    ]
    an = _analyse(segs, ref=ref)
    assert _codes(an) == ["too-few-digits"] and an.resumes[0].verdict == "equal at 5 digits"
    assert not an.precision.exact


def test_a_run_that_stops_early_is_incomplete() -> None:
    segs = [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 31))]
    assert "incomplete" in _codes(_analyse(segs))


def test_a_restart_with_nothing_left_to_train_ends_where_the_stop_saved() -> None:
    """A preemption whose SIGTERM came as the last step was trained: the script saved it
    and exited, the restart resumed there and printed no step. The run is complete."""
    segs = [_seg(0, range(1, 41), killed=True, before=CKPT), _seg(1, range(0))]
    an = _analyse(segs)
    assert an.verdict == "pass" and an.exit_code == 0 and not an.findings
    (resume,) = an.resumes
    assert resume.verdict == "nothing left to train" and resume.recomputed is None
    short = [_seg(0, range(1, 31), killed=True, before=CKPT), _seg(1, range(0))]
    an = _analyse(short)
    (found,) = [f for f in an.findings if f.code == "incomplete"]
    assert "finished at step 30, the reference at 40" in found.text
    assert an.resumes[0].verdict == "no steps" and an.exit_code == 1


def test_final_state_that_differs_fails() -> None:
    segs = [_seg(0, range(1, 23), killed=True, before=CKPT), _seg(1, range(16, 41))]
    an = _analyse(segs, final_params=FinalParams(False, 3, ["lm_head.weight"]))
    assert _codes(an) == ["final-state-differs"] and "lm_head.weight" in an.findings[0].text


def test_reference_without_step_lines_is_bad_input() -> None:
    ref = _seg(0, range(0))
    ref.other_stdout = ["epoch 1 done"]
    an = _analyse([], ref=ref)
    assert an.exit_code == 2 and _codes(an) == ["no-steps"]
    assert "--loss-regex" in an.findings[0].text and "epoch 1 done" in an.findings[0].text


def test_reference_that_crashes_fails_with_its_stderr() -> None:
    ref = _seg(0, range(1, 5), exit_code=1)
    ref.stderr_tail = ["ZeroDivisionError: division by zero"]
    an = _analyse([], ref=ref)
    assert an.exit_code == 1 and _codes(an) == ["crashed"] and "ZeroDivision" in an.findings[0].text


def test_scan_and_in_place_detection(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.json"
    a.write_text("one")
    b.write_text("two")
    before = scan(tmp_path)
    assert set(before) == {"a.json", "sub/b.json"}
    a.write_text("three, in place")  # same inode
    tmp = tmp_path / "b.tmp"
    tmp.write_text("new")
    tmp.replace(b)  # atomic: new inode
    assert modified_in_place(before, scan(tmp_path)) == ["a.json"]


def test_temp_files_written_in_place_are_not_torn_checkpoints() -> None:
    before: Snapshot = {
        "ckpt.json.tmp": (1, 10, 1),
        "step-00000050.tmp/model.pt": (2, 10, 1),
        "tmpa1b2c3": (3, 10, 1),
        "model.pt~": (4, 10, 1),
        "latest/model.pt": (5, 10, 1),
    }
    after = {k: (ino, 20, 2) for k, (ino, _, _) in before.items()}
    assert modified_in_place(before, after) == ["latest/model.pt"]

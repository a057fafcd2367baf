"""Kill plans: seeded, replayable, and covering the moments that break resumes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from crashdrill.drill.builtin import PresetTarget
from crashdrill.drill.plan import KillPoint, draw_kills, plan_gaps, preempt_gaps, preempt_plan


def _draw(seed: int, kills: int, **kw: object) -> list[KillPoint]:
    args: dict = {"candidates": range(1, 300), "first_ckpt": 50, "write_steps": None}
    args.update(kw)
    return draw_kills(random.Random(seed), kills, **args)


@pytest.mark.parametrize("seed", range(20))
def test_the_same_seed_draws_the_same_plan(seed: int) -> None:
    assert _draw(seed, 4) == _draw(seed, 4)


def test_different_seeds_draw_different_plans() -> None:
    assert len({tuple(_draw(s, 3)) for s in range(20)}) > 10


@pytest.mark.parametrize("seed", range(20))
def test_the_first_kill_lands_before_the_first_checkpoint(seed: int) -> None:
    plan = _draw(seed, 3)
    assert 1 <= plan[0].step < 50 and not plan[0].during_write


def test_the_first_kill_lands_early_before_a_late_first_checkpoint() -> None:
    # every step before the kill is trained again after it: a first checkpoint at step
    # 1000 must not cost up to 999 recomputed steps; 49 lines before step 50 -> 1..13
    firsts = {_draw(s, 2, candidates=range(1, 3000), first_ckpt=1000)[0].step for s in range(40)}
    assert min(firsts) >= 1 and max(firsts) <= 250 and len(firsts) > 10
    assert {_draw(s, 2)[0].step for s in range(40)} <= set(range(1, 14))


@pytest.mark.parametrize(("seed", "kills"), [(s, k) for s in range(10) for k in (2, 3, 5)])
def test_two_kills_or_more_include_one_inside_a_checkpoint_write(seed: int, kills: int) -> None:
    plan = _draw(seed, kills, write_steps=range(50, 300, 50))
    writes = [p for p in plan if p.during_write]
    assert len(plan) == kills and len(writes) == 1 and writes[0].step % 50 == 0


def test_one_kill_is_never_inside_a_write() -> None:
    assert not any(p.during_write for s in range(20) for p in _draw(s, 1))


@pytest.mark.parametrize("seed", range(10))
def test_kills_are_in_order_and_distinct(seed: int) -> None:
    steps = [p.step for p in _draw(seed, 6)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_the_other_kills_are_spread_over_the_run() -> None:
    plan = _draw(1, 6, first_ckpt=None, write_steps=[])
    steps = [p.step for p in plan]
    # one per sixth of the run
    assert [s * 6 // 299 for s in steps] == [0, 1, 2, 3, 4, 5]


def test_no_write_to_catch_means_only_plain_kills() -> None:
    assert not any(p.during_write for p in _draw(3, 4, write_steps=[]))


def test_more_kills_than_steps_are_capped_and_none_is_empty() -> None:
    assert len(_draw(0, 10, candidates=[1, 2, 3], first_ckpt=2)) == 3
    assert _draw(0, 0) == []
    assert _draw(0, 3, candidates=[]) == []


@pytest.mark.parametrize("seed", range(10))
def test_the_quick_preset_plan_follows_its_checkpoint_cadence(seed: int) -> None:
    target = PresetTarget("quick", "A")
    plan = target.plan(random.Random(seed), 2)
    first, write = plan
    assert 1 <= first.step < target.ckpt_every
    assert write.during_write and write.step % target.ckpt_every == 0
    assert first.step < write.step < target.steps


@pytest.mark.parametrize("seed", range(5))
def test_a_soak_lands_one_kill_in_five_inside_different_checkpoint_writes(seed: int) -> None:
    plan = _draw(seed, 50, candidates=range(1, 600), write_steps=range(50, 600, 50))
    writes = [p.step for p in plan if p.during_write]
    assert len(plan) == 50 and len(writes) == 10 == len(set(writes))
    assert all(w % 50 == 0 for w in writes) and plan[0].step < 50
    assert [p.step for p in plan] == sorted(p.step for p in plan)


def test_preempt_all_turns_every_kill_into_a_sigterm_with_its_grace() -> None:
    plan = draw_kills(random.Random(3), 3, range(1, 100), 20, [40, 60, 80])
    stops = preempt_plan(random.Random(3), plan, "all", 12.0)
    assert [k.step for k in stops] == [k.step for k in plan]
    assert all(k.preempt and not k.during_write and k.grace_s == 12.0 for k in stops)


@pytest.mark.parametrize("seed", range(20))
def test_a_mixed_schedule_has_both_kinds_and_the_seed_replays_it(seed: int) -> None:
    plan = draw_kills(random.Random(seed), 3, range(1, 100), 20, [40, 60, 80])
    mixed = preempt_plan(random.Random(seed), plan, "mixed", 5.0)
    assert any(k.preempt for k in mixed) and not all(k.preempt for k in mixed)
    assert mixed == preempt_plan(random.Random(seed), plan, "mixed", 5.0)


def test_a_single_kill_in_a_mixed_schedule_is_a_preemption() -> None:
    plan = [KillPoint(7)]
    assert preempt_plan(random.Random(0), plan, "mixed", 5.0)[0].preempt


# Plans from the reference's observed writes (issue 33 §4): each trial kind lands where
# its name says, however late or irregular the checkpoints are.


@st.composite
def _runs(draw: st.DrawFn) -> tuple[int, list[int], int, int]:
    """(steps printed, the steps after which a checkpoint was written, kills, seed)."""
    steps = draw(st.integers(min_value=8, max_value=400))
    writes = draw(st.lists(st.integers(2, steps - 1), min_size=1, max_size=12, unique=True))
    return steps, sorted(writes), draw(st.integers(1, 6)), draw(st.integers(0, 2**32))


def _observed(steps: int, writes: list[int], kills: int, seed: int) -> list[KillPoint]:
    cands = list(range(1, steps))  # as verify_command: every printed step but the last
    aimed = [w for w in writes[1:-1] if w in cands]
    return draw_kills(random.Random(seed), kills, cands, writes[0], aimed, checkpoints=writes)


@given(_runs())
@hypothesis_settings(max_examples=300, deadline=None)
def test_each_planned_trial_lands_in_the_window_its_kind_names(
    run: tuple[int, list[int], int, int],
) -> None:
    steps, writes, kills, seed = run
    plan = _observed(steps, writes, kills, seed)
    plain_room = [s for s in range(writes[0] + 1, steps) if s not in writes]
    for k in plan:
        if k.kind == "before-first-checkpoint":
            assert k.step < writes[0], (k, writes)
        elif k.kind == "inside-write":
            # neither the first write nor the last; the copy starts after the one before it
            assert k.step in writes[1:-1], (k, writes)
            assert k.after_write == max(w for w in writes if w < k.step)
        elif len(plain_room) >= kills:  # room for every plain kill after a checkpoint
            # after a complete write, before the next one, with steps to recompute
            assert k.step > writes[0] and k.step not in writes, (k, writes)
    gaps = plan_gaps(plan, kills, writes[0], writes, writes[1:-1])
    kinds = {k.kind for k in plan}
    # every trial kind is either planned or said to be impossible, never both
    assert kinds.isdisjoint(gaps), (plan, gaps)
    assert kinds | set(gaps) == {"before-first-checkpoint", "after-checkpoint", "inside-write"}


@pytest.mark.parametrize("seed", range(40))
def test_a_late_first_checkpoint_still_gets_a_plain_kill_after_it(seed: int) -> None:
    # The reference of tests/integration/research/plan_late_ckpt.py: 60 steps, checkpoints
    # after 36, 44 and 53. The spread plan put the third kill anywhere in the run, before
    # the first checkpoint on 18 of these 40 seeds.
    plan = _observed(60, [36, 44, 53], 3, seed)
    assert [k.kind for k in plan].count("after-checkpoint") == 1, plan
    (plain,) = [k for k in plan if k.kind == "after-checkpoint"]
    assert plain.step > 36 and plain.step not in (44, 53)
    assert plan_gaps(plan, 3, 36, [36, 44, 53], [44]) == {}


def test_a_script_with_fewer_than_three_writes_has_no_write_to_land_a_kill_in() -> None:
    for writes in ([30], [30, 50]):
        plan = _observed(60, writes, 2, 4)
        assert not any(k.during_write for k in plan), plan
        gaps = plan_gaps(plan, 2, writes[0], writes, [])
        assert "neither the first" in gaps["inside-write"], gaps
        assert f"{len(writes)} checkpoint(s)" in gaps["inside-write"]
        assert [k.kind for k in plan] == ["before-first-checkpoint", "after-checkpoint"]


def test_a_plan_says_which_trials_it_cannot_hold_and_why() -> None:
    none = draw_kills(random.Random(0), 2, range(1, 50), None, [], checkpoints=[])
    assert {k.kind for k in none} == {"before-first-checkpoint"}  # no checkpoint at all
    never = plan_gaps(none, 2, None, [], [])
    assert set(never) == {"after-checkpoint", "inside-write"}
    assert all("no checkpoint" in why for why in never.values()), never
    one = _observed(60, [20, 40, 50], 1, 0)
    assert "--kills 2" in plan_gaps(one, 1, 20, [20, 40, 50], [40])["inside-write"]
    two = _observed(60, [20, 40, 50], 2, 0)
    assert "--kills 3" in plan_gaps(two, 2, 20, [20, 40, 50], [40])["after-checkpoint"]
    first = plan_gaps(_observed(60, [1, 40, 50], 3, 0), 3, 1, [1, 40, 50], [40])
    assert "no step line comes before the first checkpoint" in first["before-first-checkpoint"]


def test_the_quick_preset_s_plain_kills_fall_between_its_writes() -> None:
    target = PresetTarget("quick", "A")
    for seed in range(20):
        plan = target.plan(random.Random(seed), 5)
        plain = [k.step for k in plan if k.kind == "after-checkpoint"]
        assert len(plain) == 3 and all(
            s > target.ckpt_every and s % target.ckpt_every for s in plain
        ), plan
        assert target.plan_gaps(plan, 5) == {}
    gaps = target.plan_gaps(target.plan(random.Random(1), 2), 2)
    assert list(gaps) == ["after-checkpoint"], gaps


def test_a_preemption_that_replaced_a_trial_s_only_kill_says_so() -> None:
    plan = _observed(60, [20, 40, 50], 2, 3)
    stops = preempt_plan(random.Random(3), plan, "all", 5.0)
    _, gaps = preempt_gaps(plan, stops, plan_gaps(plan, 2, 20, [20, 40, 50], [40]))
    assert gaps["inside-write"] == gaps["before-first-checkpoint"]
    assert "--preempt" in gaps["inside-write"]

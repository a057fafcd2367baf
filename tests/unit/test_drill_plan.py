"""Kill plans: seeded, replayable, and covering the moments that break resumes."""

from __future__ import annotations

import random

import pytest

from crashdrill.drill.builtin import PresetTarget
from crashdrill.drill.plan import KillPoint, draw_kills, preempt_plan


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

"""Admission (server/admission.py): the machine's runs always, up to its ceiling while the
runs keep the pace this lab measured when it had room; a max_concurrent above the ceiling
is clamped with a warning in the start line and /api/health, unless allow_overcommit."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.server import serve_cli
from crashdrill.server.admission import Admission, machine_ceiling, machine_runs
from crashdrill.server.queue_wait import RunWork
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.start_times import StartTimes


def work(pace: float | None, preset: str = "quick", run: str = "r") -> RunWork:
    return RunWork(run, "p", preset, 100, pace)


def two_cores(asked: int | None, allow_overcommit: bool = False) -> Admission:
    return Admission(asked, machine_runs(0, 2), machine_ceiling(0, 2), allow_overcommit)


def test_a_machine_carries_a_run_per_core_up_to_two_per_core_and_a_pair_per_gpu() -> None:
    assert (machine_runs(0, 2), machine_ceiling(0, 2)) == (2, 4)
    assert (machine_runs(0, 1), machine_ceiling(0, 1)) == (2, 4)  # a pair, at least
    assert (machine_runs(0, 16), machine_ceiling(0, 16)) == (16, 32)
    assert (machine_runs(2, 16), machine_ceiling(2, 16)) == (4, 4)  # GPU memory: no more


def test_before_anything_is_measured_only_the_machine_s_runs_are_admitted() -> None:
    a = two_cores(4)
    assert a.limit([]) == 2
    assert a.limit([work(None), work(None)]) == 2  # started, no step yet


def test_runs_that_keep_their_pace_let_more_in_and_a_slowed_machine_stops_that() -> None:
    a = two_cores(4)
    assert a.limit([work(0.02), work(0.021)]) == 4  # the fastest measured: room
    assert a.limit([work(0.025), work(0.029)]) == 4  # within 1.5× of 0.02
    assert a.limit([work(0.035), work(0.04), work(0.04)]) == 2  # median 0.04 > 0.03: full
    assert a.status()["limit"] == 2 and a.status()["keeps_pace"] is False
    assert a.limit([work(0.021, run="x")]) == 4  # runs ended: back at its pace


def test_each_preset_is_judged_against_its_own_fastest_pace() -> None:
    a = two_cores(4)
    a.limit([work(0.02, "quick"), work(0.2, "slow")])
    assert a.limit([work(0.02, "quick"), work(0.25, "slow")]) == 4
    assert a.limit([work(0.02, "quick"), work(0.5, "slow")]) == 2


def test_starts_that_take_much_longer_than_the_fastest_hold_new_runs_back() -> None:
    starts = StartTimes()
    for s in (0.4, 0.5):
        starts.add(s)
    a = two_cores(4)
    assert a.limit([work(0.02)], starts) == 4  # median 0.45 ≤ 1.5 × 0.4
    for s in (3.0, 4.0, 5.0):
        starts.add(s)
    assert a.limit([work(0.02)], starts) == 2  # median 3.0 > 0.6


def test_a_limit_above_the_machine_s_ceiling_is_clamped_with_a_warning(tmp_path: Path) -> None:
    a = two_cores(60)
    assert a.clamped and a.ceiling == 4
    assert a.limit([work(0.02), work(0.02)]) == 4
    assert a.warning and "max_concurrent 60" in a.warning and "--allow-overcommit" in a.warning
    health = a.status()
    assert health["clamped"] and health["warning"] == a.warning and health["ceiling"] == 4
    assert "WARNING: max_concurrent 60" in a.describe()
    assert ";" not in a.describe()  # the start line's parts are separated by "; "


def test_allow_overcommit_keeps_the_limit_as_asked_measured_or_not() -> None:
    a = two_cores(60, allow_overcommit=True)
    assert not a.clamped and a.warning is None
    assert a.limit([]) == 60 and a.limit([work(0.5), work(0.02)]) == 60
    assert a.describe() == "up to 60 runs at once"


def test_a_limit_at_or_below_the_machine_s_runs_is_the_limit() -> None:
    a = two_cores(2)
    assert a.limit([work(0.02)]) == 2 and a.describe() == "up to 2 runs at once"
    assert two_cores(1).limit([work(0.02)]) == 1


def test_the_settings_clamp_by_default_and_keep_it_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashdrill.server.settings import default_max_concurrent

    big = default_max_concurrent() * 10
    clamped = Admission.from_settings(Settings(data_dir=tmp_path, max_concurrent=big), gpus=0)
    assert clamped.clamped and clamped.ceiling == default_max_concurrent()
    kept = Settings(data_dir=tmp_path, max_concurrent=big, allow_overcommit=True)
    assert Admission.from_settings(kept, gpus=0).ceiling == big
    assert "WARNING" in serve_cli.run_limit_text(Settings(data_dir=tmp_path, max_concurrent=big))
    monkeypatch.setenv("CRASHDRILL_ALLOW_OVERCOMMIT", "yes")
    assert Settings.from_env().allow_overcommit is True
    monkeypatch.setenv("CRASHDRILL_ALLOW_OVERCOMMIT", "maybe")
    with pytest.raises(SettingsError, match="CRASHDRILL_ALLOW_OVERCOMMIT = 'maybe': 1, true"):
        Settings.from_env()


def test_on_a_cluster_the_limit_given_is_the_limit_whatever_this_machine_is(
    tmp_path: Path,
) -> None:
    mirror = str(tmp_path / "mirror")
    s = Settings(executor="ray", ray_address="127.0.0.1:6379", mirror=mirror, max_concurrent=50)
    a = Admission.from_settings(s, gpus=0)
    assert not a.clamped and a.limit([]) == 50
    none = Settings(executor="ray", ray_address="127.0.0.1:6379", mirror=mirror)
    assert Admission.from_settings(none, gpus=0).limit([]) is None


def test_serve_accepts_allow_overcommit() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    serve_cli._add_arguments(parser)
    args = parser.parse_args(["--max-concurrent", "60", "--allow-overcommit"])
    assert args.max_concurrent == 60 and args.allow_overcommit is True

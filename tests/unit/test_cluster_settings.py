"""`crashdrill serve --executor NAME` (and `--ray ADDRESS`, its shorthand): what cannot work
exits 2 naming the setting, before serving."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from crashdrill.server import serve_cli
from crashdrill.server.cluster import executor_for
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.workers.executor_registry import KINDS, executor_kind
from crashdrill.workers.local_executor import LocalExecutor
from tests.support.extras import require_extra
from tests.support.lab import free_port
from tests.support.quickstart import quickstart


def test_the_default_lab_runs_its_trainers_on_this_machine(tmp_path: Path) -> None:
    assert isinstance(executor_for(Settings(data_dir=tmp_path)), LocalExecutor)


@pytest.mark.parametrize("mirror", ["", "off"])
def test_ray_without_a_mirror_every_node_reaches_is_refused_naming_the_setting(
    tmp_path: Path, mirror: str
) -> None:
    needs = r"ray_address = '127\.0\.0\.1:6379'\) needs a checkpoint"
    with pytest.raises(SettingsError, match=needs):
        Settings(data_dir=tmp_path, executor="ray", ray_address="127.0.0.1:6379", mirror=mirror)


def test_serve_with_ray_and_no_mirror_exits_2_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRASHDRILL_MIRROR", raising=False)
    monkeypatch.setenv("CRASHDRILL_RAY_ADDRESS", "127.0.0.1:6379")
    code = serve_cli.main(["--data-dir", str(tmp_path / "lab"), "--port", str(free_port())])
    assert code == 2
    err = capsys.readouterr().err
    assert "mirror (--mirror, CRASHDRILL_MIRROR)" in err and "127.0.0.1:6379" in err


def test_serve_with_an_unreachable_ray_address_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_extra("ray")
    address = f"127.0.0.1:{free_port()}"
    args = ["--data-dir", str(tmp_path / "lab"), "--port", str(free_port())]
    code = serve_cli.main([*args, "--ray", address, "--mirror", str(tmp_path / "mirror")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot reach the Ray cluster at {address}" in err
    assert "--ray-address, CRASHDRILL_RAY_ADDRESS" in err
    assert not (tmp_path / "lab" / "crashdrill.sqlite3").exists()  # refused before anything


def test_the_test_setup_installs_ray_and_the_default_lab_does_not() -> None:
    sets = quickstart().INSTALL_SETS
    assert "ray" in sets["test"] and "ray" not in sets["lab"]


def test_an_unknown_executor_exits_2_naming_the_ones_there_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data-dir", str(tmp_path / "lab"), "--port", str(free_port())]
    assert serve_cli.main([*args, "--executor", "k8s"]) == 2
    err = capsys.readouterr().err
    assert "executor = 'k8s': one of local, ray (--executor, CRASHDRILL_EXECUTOR)" in err
    assert not (tmp_path / "lab" / "crashdrill.sqlite3").exists()


def test_ray_is_short_for_executor_ray_with_its_address_and_refuses_to_contradict_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    serve_cli._add_arguments(parser)
    short = parser.parse_args(["--ray", "head:6379"])
    assert serve_cli.executor_options(short) == ("ray", "head:6379")
    both = parser.parse_args(["--ray", "head:6379", "--executor", "ray"])
    assert serve_cli.executor_options(both) == ("ray", "head:6379")
    args = ["--data-dir", str(tmp_path / "lab"), "--port", str(free_port())]
    assert serve_cli.main([*args, "--ray", "head:6379", "--executor", "local"]) == 2
    assert "--ray head:6379 is short for --executor ray" in capsys.readouterr().err


def test_the_executor_is_ray_when_only_an_address_is_set_and_its_options_must_agree(
    tmp_path: Path,
) -> None:
    mirror = str(tmp_path / "mirror")
    assert Settings(data_dir=tmp_path).executor == "local"
    assert Settings(data_dir=tmp_path, ray_address="h:1", mirror=mirror).executor == "ray"
    with pytest.raises(SettingsError, match=r"ray_address = 'h:1' is for executor 'ray'"):
        Settings(data_dir=tmp_path, executor="local", ray_address="h:1", mirror=mirror)
    with pytest.raises(SettingsError, match=r"executor = 'ray' needs ray_address \(--ray-address"):
        Settings(data_dir=tmp_path, executor="ray", mirror=mirror)


def test_every_registered_executor_names_a_factory_that_exists() -> None:
    for kind in KINDS.values():
        module, _, function = kind.factory.partition(":")
        if kind.extra is not None:
            require_extra(kind.extra)
        assert callable(getattr(importlib.import_module(module), function)), kind
    assert executor_kind("local").cluster is False and executor_kind("ray").cluster is True
    assert Settings(executor="ray", ray_address="h:1", mirror="/m").on_cluster is True

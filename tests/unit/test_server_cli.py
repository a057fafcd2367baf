"""`crashdrill serve` and its settings, without starting a server."""

from __future__ import annotations

import argparse
import secrets
import socket
from pathlib import Path

import pytest

from crashdrill.server import serve_cli
from crashdrill.server.settings import (
    MIN_TOKEN_BITS,
    Settings,
    SettingsError,
    default_max_concurrent,
    token_bits,
    token_problem,
)


def test_settings_come_from_the_environment_then_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CRASHDRILL_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("CRASHDRILL_INSTRUCTOR_TOKEN", "t0ken-of-sixteen-chars")
    monkeypatch.setenv("CRASHDRILL_MAX_CONCURRENT", "3")
    monkeypatch.setenv("CRASHDRILL_TRAINER_COMMAND", "python -m my.trainer")
    s = Settings.from_env(port=9000, max_concurrent=None)
    assert (s.data_dir, s.port, s.max_concurrent) == (tmp_path / "env", 9000, 3)
    assert s.instructor_token == "t0ken-of-sixteen-chars"
    assert s.trainer_command == ("python", "-m", "my.trainer")
    assert Settings.from_env(data_dir=str(tmp_path / "cli")).data_dir == tmp_path / "cli"


def test_the_default_data_dir_is_the_users_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CRASHDRILL_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert Settings().data_dir == tmp_path / "crashdrill"


def test_bad_settings_say_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="port = 0"):
        Settings(port=0)
    with pytest.raises(SettingsError, match="max_concurrent = 0"):
        Settings(max_concurrent=0)
    monkeypatch.setenv("CRASHDRILL_MAX_CONCURRENT", "many")
    with pytest.raises(SettingsError, match="CRASHDRILL_MAX_CONCURRENT = 'many'"):
        Settings.from_env()
    monkeypatch.delenv("CRASHDRILL_MAX_CONCURRENT")
    with pytest.raises(SettingsError, match=r"trainer_nice = 20: a nice value in 0\.\.19"):
        Settings(trainer_nice=20)
    monkeypatch.setenv("CRASHDRILL_TRAINER_NICE", "low")
    with pytest.raises(SettingsError, match="CRASHDRILL_TRAINER_NICE = 'low'"):
        Settings.from_env()
    monkeypatch.setenv("CRASHDRILL_TRAINER_NICE", "0")
    assert Settings.from_env().trainer_nice == 0


def test_at_least_two_runs_may_train_at_once_by_default() -> None:
    assert default_max_concurrent() >= 2


def test_the_secret_key_is_made_once_and_kept(tmp_path: Path) -> None:
    key = Settings(data_dir=tmp_path).resolve_secret_key()
    assert len(key) > 30 and Settings(data_dir=tmp_path).resolve_secret_key() == key
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    assert Settings(data_dir=tmp_path, secret_key="given").resolve_secret_key() == "given"


def test_serve_refuses_a_port_in_use_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        parser = argparse.ArgumentParser()
        serve_cli.add_parser(parser.add_subparsers()).set_defaults(func=serve_cli.run)
        args = parser.parse_args(["serve", "--port", str(port), "--data-dir", str(tmp_path)])
        assert args.func(args) == 2
    assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_serve_refuses_bad_settings_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_cli.main(["--port", "70000"]) == 2
    assert "port = 70000" in capsys.readouterr().err


def test_serve_refuses_an_allowed_host_with_a_port_with_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(tmp_path), "--allowed-hosts", "lab.example.org,lab:8000"]
    assert serve_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "CRASHDRILL_ALLOWED_HOSTS: 'lab:8000'" in err and "without scheme or port" in err


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from crashdrill.server.app import create_app

    create_app(Settings(data_dir=tmp_path))
    with pytest.raises(SettingsError, match=f"another crashdrill server .* uses {tmp_path}"):
        create_app(Settings(data_dir=tmp_path))


def test_a_token_of_spaces_or_of_few_distinct_characters_is_refused_naming_the_rule(
    tmp_path: Path,
) -> None:
    for weak, said in (
        (" " * 16, "0 characters after stripping spaces: at least 16"),
        ("  short-token-1 \n", "13 characters after stripping spaces"),
        ("a" * 40, "40 characters of 1 distinct hold 0 bits"),
        ("teach-me-crash-tests", "20 characters of 9 distinct hold 63 bits"),
        ("tab\tinside-a-long-token", "control character"),
    ):
        with pytest.raises(SettingsError, match="CRASHDRILL_INSTRUCTOR_TOKEN") as caught:
            Settings(data_dir=tmp_path, instructor_token=weak)
        assert said in str(caught.value), weak
        assert "secrets.token_urlsafe(24)" in str(caught.value)
    kept = Settings(data_dir=tmp_path, instructor_token="  Zq3-kP9_xW2mR7vT4nB8yL1 \n")
    assert kept.instructor_token == "Zq3-kP9_xW2mR7vT4nB8yL1"  # stripped
    assert Settings(data_dir=tmp_path, instructor_token="").instructor_token == ""  # off
    assert token_bits("0123456789abcdef") == MIN_TOKEN_BITS  # the smallest token that passes
    assert token_problem(secrets.token_urlsafe(24)) is None


def test_with_a_token_the_start_line_says_instructor_mode_is_on_and_where(
    tmp_path: Path,
) -> None:
    s = Settings(data_dir=tmp_path, instructor_token="a-long-enough-token-1234")
    line = serve_cli.instructor_mode(s)
    assert line == f"instructor mode on: log in at http://{s.host}:{s.port}/instructor"
    assert "a-long-enough-token" not in line  # the token itself is never printed here


def test_without_a_token_the_start_line_says_off_and_how_to_turn_it_on(tmp_path: Path) -> None:
    line = serve_cli.instructor_mode(Settings(data_dir=tmp_path))
    assert line.startswith("instructor mode off")
    assert "quickstart.py lab --instructor" in line


def test_on_a_cluster_the_nodes_decide_how_many_runs_train_unless_a_limit_is_given(
    tmp_path: Path,
) -> None:
    from crashdrill.server.serve_cli import run_limit_text

    mirror = str(tmp_path / "mirror")
    assert Settings().max_concurrent == default_max_concurrent()
    on_cluster = Settings(executor="ray", ray_address="127.0.0.1:6379", mirror=mirror)
    assert on_cluster.max_concurrent is None
    assert run_limit_text(on_cluster) == "as many runs at once as the cluster's nodes take"
    capped = Settings(executor="ray", ray_address="127.0.0.1:6379", mirror=mirror, max_concurrent=4)
    assert capped.max_concurrent == 4 and run_limit_text(capped) == "up to 4 runs at once"

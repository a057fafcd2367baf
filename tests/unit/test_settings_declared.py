"""The settings are declared once (server/settings_sections/): the variables, the
`crashdrill serve` flags, the errors and docs/server.md's tables all come from there."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from crashdrill.server import serve_cli
from crashdrill.server.setting_schema import NUMBER, SIZE, SWITCH, WHOLE, declared_fields
from crashdrill.server.settings import Settings, SettingsError
from crashdrill.server.settings_doc import with_tables
from crashdrill.server.settings_env import declared_variables, values_from_env
from crashdrill.server.settings_sections import SECTIONS

DOC = Path(__file__).parents[2] / "docs" / "server.md"


def test_docs_server_md_settings_tables_are_the_ones_the_declarations_make() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert with_tables(doc) == doc, "run: .venv/bin/python scripts/settings_table.py"


def test_every_field_of_the_flat_settings_is_declared_in_exactly_one_section() -> None:
    owners: dict[str, list[str]] = {}
    for section in SECTIONS:
        for name, _ in declared_fields(section):
            owners.setdefault(name, []).append(section.__name__)
    flat = [f.name for f in dataclasses.fields(Settings)]
    assert sorted(flat) == sorted(owners), "a Settings field without a section"
    assert all(len(v) == 1 for v in owners.values()), owners


def test_no_two_settings_share_a_variable_or_a_flag() -> None:
    variables = [v for v, _, _ in declared_variables()]
    flags = [d.flag for s in SECTIONS for _, d in declared_fields(s) if d.flag]
    assert len(variables) == len(set(variables)) and len(flags) == len(set(flags))


@pytest.mark.parametrize(
    ("variable", "kind"),
    [
        (v, d.parse.kind)
        for v, _, d in declared_variables()
        if d.parse in (WHOLE, NUMBER, SIZE, SWITCH)
    ],
)
def test_a_variable_that_is_not_a_value_is_refused_naming_it_its_text_and_what_is_allowed(
    variable: str, kind: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        values_from_env({variable: "lots"})
    assert str(caught.value) == f"{variable} = 'lots': {kind}"


def test_an_empty_or_blank_variable_counts_as_unset_but_a_blank_token_is_refused() -> None:
    assert values_from_env({"CRASHDRILL_MAX_CONCURRENT": "", "CRASHDRILL_MIRROR": "  "}) == {}
    assert values_from_env({"CRASHDRILL_INSTRUCTOR_TOKEN": "   "}) == {"instructor_token": "   "}
    with pytest.raises(SettingsError, match="CRASHDRILL_INSTRUCTOR_TOKEN"):
        Settings(instructor_token="   ")


def test_every_declared_flag_reaches_its_setting(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    serve_cli._add_arguments(parser)
    args = parser.parse_args(
        ["--port", "8123", "--request-read-timeout", "4.5", "--allowed-hosts", "a.org,b.org"]
    )
    flags = serve_cli.setting_flags(args)
    declared = {n for s in SECTIONS for n, d in declared_fields(s) if d.flag}
    assert set(flags) == declared
    assert (flags["port"], flags["request_read_timeout_s"]) == (8123, 4.5)
    assert flags["allowed_hosts"] == ("a.org", "b.org") and flags["mirror"] is None


def test_a_flag_that_is_not_a_value_exits_2_naming_the_flag_its_text_and_what_is_allowed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        serve_cli.main(["--listen-backlog", "deep"])
    assert caught.value.code == 2
    assert "argument --listen-backlog: 'deep': a whole number" in capsys.readouterr().err


def test_a_value_outside_what_is_allowed_names_the_setting_and_how_it_is_set(
    tmp_path: Path,
) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(data_dir=tmp_path, listen_backlog=1)
    assert str(caught.value) == (
        "listen_backlog = 1: 16 to 65535 (--listen-backlog, CRASHDRILL_LISTEN_BACKLOG)"
    )

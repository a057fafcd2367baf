"""`crashdrill doctor supabase` against the local Realtime endpoint: a working setup, and
each failure named for what it is."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import pytest

from crashdrill.server.stream import realtime_doctor
from tests.support.extras import require_extra
from tests.support.fake_realtime import ANON_KEY, SERVICE_KEY, FakeRealtime
from tests.support.lab import free_port

pytestmark = pytest.mark.timeout(60)
require_extra("supabase", module=True)  # every test here runs Supabase's client


@pytest.fixture(autouse=True)
def no_supabase_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SUPABASE_URL", "SUPABASE_ANON_KEY", "SUPABASE_SERVICE_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeRealtime]:
    with FakeRealtime() as f:
        yield f


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    realtime_doctor.add_arguments(parser)
    code = realtime_doctor.run(parser.parse_args(list(argv)))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_working_setup_reports_round_trips_and_exits_0(
    fake: FakeRealtime, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = doctor(
        capsys,
        "--url",
        fake.url,
        "--anon-key",
        ANON_KEY,
        "--service-key",
        SERVICE_KEY,
        "--messages",
        "4",
    )
    assert code == 0, out
    assert "median" in out and "max" in out and "(4 messages)" in out
    # As the lab does: the service key publishes on a private channel the anon key reads.
    assert {(role, private) for _, role, private in fake.joins} == {
        ("anon", True),
        ("service", True),
    }
    assert len(fake.broadcasts()) == 4
    assert SERVICE_KEY not in out


def test_settings_come_from_the_environment(
    fake: FakeRealtime, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPABASE_URL", fake.url)
    monkeypatch.setenv("SUPABASE_ANON_KEY", ANON_KEY)
    code, out = doctor(capsys, "--messages", "2")
    assert code == 0, out
    assert "public test channel" in out  # no service key: the anon key publishes


def test_a_bad_key_is_named(fake: FakeRealtime, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = doctor(capsys, "--url", fake.url, "--anon-key", "not-the-key")
    assert code == 1
    assert "bad key" in out and "HTTP 401" in out and "anon key" in out
    assert fake.refused == [401]


def test_an_unreachable_url_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = doctor(capsys, "--url", f"http://127.0.0.1:{free_port()}", "--anon-key", ANON_KEY)
    assert code == 1 and "bad URL" in out and "connection refused" in out


def test_a_name_that_does_not_resolve_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = doctor(capsys, "--url", "https://no-such-project.invalid", "--anon-key", ANON_KEY)
    assert code == 1 and "does not resolve" in out


def test_a_private_channel_the_anon_key_may_not_read_gets_the_policy_to_add(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with FakeRealtime(anon_may_read_private=False) as fake:
        code, out = doctor(
            capsys, "--url", fake.url, "--anon-key", ANON_KEY, "--service-key", SERVICE_KEY
        )
    assert code == 1
    assert "channel not authorised" in out and "create policy" in out


def test_rate_limiting_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeRealtime(join_error="too_many_joins") as fake:
        code, out = doctor(capsys, "--url", fake.url, "--anon-key", ANON_KEY)
    assert code == 1 and "rate limited" in out and "too_many_joins" in out


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(capsys)[0] == 2
    assert doctor(capsys, "--url", "ftp://x", "--anon-key", "k")[0] == 2
    assert (
        doctor(capsys, "--url", "https://x.supabase.co", "--anon-key", "k", "--messages", "0")[0]
        == 2
    )


def test_without_supabase_s_client_the_doctor_names_the_extra_and_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "supabase", None)  # `import supabase` fails
    code, out = doctor(capsys, "--url", "https://x.supabase.co", "--anon-key", ANON_KEY)
    assert code == 2 and "pip install 'crashdrill[supabase]'" in out

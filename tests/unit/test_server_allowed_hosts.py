"""The lab answers only to its own names (server/door/allowed_hosts.py): a page whose name was
re-pointed at the lab (DNS rebinding) gets 400 on every route, before the Origin check."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from crashdrill.server.door.allowed_hosts import host_allowed, name_of
from crashdrill.server.settings import Settings, SettingsError
from tests.support.lab import app_state, stand_in_app, stand_in_settings

pytestmark = pytest.mark.timeout(90)

REBIND = "rebind.attacker.example:8802"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    # allowed_hosts=(): the product's default
    return stand_in_settings(tmp_path / "lab", monkeypatch, steps=400, allowed_hosts=())


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return stand_in_app(settings)


@pytest.fixture
def lab(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        yield client


def test_a_rebound_name_with_a_matching_origin_cannot_start_a_pair_or_read_one(
    lab: TestClient,
) -> None:
    r = lab.post(
        "/api/pairs",
        json={"preset": "quick"},
        headers={"Host": REBIND, "Origin": f"http://{REBIND}"},
    )
    assert r.status_code == 400, r.text
    assert REBIND in r.json()["detail"] and "CRASHDRILL_ALLOWED_HOSTS" in r.json()["detail"]
    assert app_state(lab).lab.store.class_page(0, 10)[1] == 0
    made = lab.post("/api/pairs", json={"preset": "quick"})  # Host 127.0.0.1:8000
    assert made.status_code == 201, made.text
    pair = made.json()["pair"]
    assert lab.get(f"/api/pairs/{pair}", headers={"Host": REBIND}).status_code == 400
    assert lab.get("/api/health", headers={"Host": REBIND}).status_code == 400
    assert lab.get(f"/api/pairs/{pair}", headers={"Host": "localhost:5173"}).status_code == 200


def test_loopback_names_ip_addresses_and_the_listening_host_are_the_lab_s_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRASHDRILL_ALLOWED_HOSTS", raising=False)
    plain = Settings(data_dir=tmp_path)
    assert plain.allowed_hosts == ()
    for host in ("127.0.0.1:8000", "localhost", "LocalHost.:80", "[::1]:8000", "192.168.1.20"):
        name = name_of(host)
        assert name is not None and host_allowed(name, plain), host
    for host in ("rebind.attacker.example:8802", "testserver", "127.0.0.1.nip.io"):
        name = name_of(host)
        assert name is not None and not host_allowed(name, plain), host
    assert name_of("a b:80") is None and name_of("[::1]:99999999") is None
    bound = Settings(data_dir=tmp_path, host="labbox")
    assert host_allowed("labbox", bound)
    monkeypatch.setenv("CRASHDRILL_ALLOWED_HOSTS", "lab.example.org, Other.Example.org")
    named = Settings(data_dir=tmp_path)
    assert named.allowed_hosts == ("lab.example.org", "Other.Example.org")
    assert host_allowed("other.example.org", named) and not host_allowed("example.org", named)
    assert host_allowed("anything.example", dataclasses.replace(named, allowed_hosts=("*",)))


def test_an_allowed_host_that_is_not_a_name_stops_the_lab_naming_the_entry(
    tmp_path: Path,
) -> None:
    for entry in ("https://lab.example.org", "lab.example.org:8000", "lab example"):
        with pytest.raises(SettingsError, match="CRASHDRILL_ALLOWED_HOSTS") as caught:
            Settings(data_dir=tmp_path, allowed_hosts=(entry,))
        assert repr(entry) in str(caught.value)


def test_behind_a_trusted_proxy_the_forwarded_host_is_the_one_checked(
    settings: Settings,
) -> None:
    proxied = dataclasses.replace(
        settings, trusted_proxies=("testclient",), allowed_hosts=("lab.example.org",)
    )
    app = stand_in_app(proxied)
    with TestClient(app, base_url="http://lab-internal:8000") as client:
        ok = client.get("/api/presets", headers={"X-Forwarded-Host": "lab.example.org"})
        assert ok.status_code == 200, ok.text
        bad = client.get("/api/presets", headers={"X-Forwarded-Host": REBIND})
        assert bad.status_code == 400 and REBIND in bad.json()["detail"]

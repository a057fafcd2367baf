"""Forwarded headers are believed only from trusted proxies (server/door/forwarded.py)."""

from __future__ import annotations

from pathlib import Path

from crashdrill.server.door.forwarded import client_address, request_origin, served_over_https
from crashdrill.server.settings import Settings


def scope(peer: str, **headers: str) -> dict[str, object]:
    raw = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "client": (peer, 5000), "scheme": "http", "headers": raw}


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    s = scope("203.0.113.9", x_forwarded_for="10.1.1.1", x_forwarded_proto="https", host="lab")
    assert client_address(s, settings) == "203.0.113.9"
    assert not served_over_https(s, settings)
    assert request_origin(s, settings) == "http://lab"


def test_a_trusted_proxy_names_the_client_and_the_scheme(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, trusted_proxies=("10.0.0.2", "10.0.0.3"))
    s = scope(
        "10.0.0.2",
        x_forwarded_for="198.51.100.7, 203.0.113.5, 10.0.0.3",
        x_forwarded_proto="https",
        x_forwarded_host="lab.example.org",
        host="internal:8000",
    )
    assert client_address(s, settings) == "203.0.113.5"  # the nearest untrusted hop
    assert served_over_https(s, settings)
    assert request_origin(s, settings) == "https://lab.example.org"
    assert served_over_https(scope("10.9.9.9"), Settings(data_dir=tmp_path, https=True))

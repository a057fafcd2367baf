"""The content security policy (server/door/browser_guard.py); the middleware itself is tested
against the real server in tests/integration/test_server_hardening.py."""

from __future__ import annotations

from pathlib import Path

from crashdrill.server.door.browser_guard import content_security_policy
from crashdrill.server.settings import Settings


def test_the_csp_allows_only_the_lab_s_own_scripts_and_styles(tmp_path: Path) -> None:
    csp = content_security_policy(Settings(data_dir=tmp_path))
    assert "script-src 'self';" in csp and "style-src 'self';" in csp
    assert "connect-src 'self';" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe" not in csp


def test_with_realtime_the_csp_adds_the_project_s_https_and_wss_endpoints(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, supabase_url="https://abc.supabase.co", supabase_anon_key="anon"
    )
    csp = content_security_policy(settings)
    assert "script-src 'self' https://abc.supabase.co;" in csp
    assert "connect-src 'self' https://abc.supabase.co wss://abc.supabase.co;" in csp

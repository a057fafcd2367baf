"""The Preempt button beside Crash test, in a real Chromium: it sends SIGTERM, the grace
counts down under the buttons, and the run resumes from the checkpoint its trainer saved
on the way out, losing nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.test_lab_layout import RUN_MS, start, stop_both, wait_step

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]


def test_preempt_sigterms_the_run_counts_the_grace_and_the_resume_loses_nothing(
    lab_server: Any, page: Any
) -> None:
    start(page, lab_server.url + "/?preset=browser")
    try:
        wait_step(page, "A", 20)
        page.wait_for_function(
            "() => !document.querySelector('.run-A .preempt').disabled", timeout=RUN_MS
        )
        page.locator(".run-A .preempt").click()
        why = page.locator(".run-A .crash-why")
        why.filter(has_text="The stop lost nothing: it saved step").wait_for(timeout=RUN_MS)
        assert "stopped gracefully at step" in why.inner_text()
        assert page.locator(".run-B .preempt").is_enabled()  # only A was preempted
    finally:
        stop_both(page)
    assert not page.errors, page.errors

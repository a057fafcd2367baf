"""The page of a pair whose runs diverge (issue #24, item 2), in a real Chromium with the
real trainer: a lesson link with settings lesson-1.7-fast allows (lr 1, weight_decay 10,
warmup 0, grad_clip 1000). Before, the page's records loader threw on the API's bare NaN
and the stream's frames were dropped; now each run's badge says diverged, its line says at
which step, what was not finite and which settings the student changed, the loss chart
marks the step, Crash test is off, and the page logs no error."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.browser_lab import RUN_MS, start

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

LINK = "/lesson/lesson-1.7-fast?lr=1&weight_decay=10&warmup=0&grad_clip=1000"


def test_a_pair_that_diverges_says_so_names_the_changed_settings_and_throws_nothing(
    lab_server: Any, page: Any
) -> None:
    start(page, lab_server.url + LINK)
    page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=RUN_MS)
    for label in "AB":
        assert page.locator(f".run-{label} .badge").inner_text() == "diverged"
        line = page.locator(f".run-card.run-{label} .state-line").inner_text()
        assert line.startswith("Diverged at step "), line
        assert "Settings changed from the lesson: " in line, line
        assert all(f"{k} = " in line for k in ("lr", "weight_decay", "warmup", "grad_clip"))
        assert page.locator(f".run-{label} .crash").is_disabled()
    table = page.locator("#chart-loss table.chart-table")
    table.filter(has_text="diverged at step").first.wait_for()
    assert page.errors == [], page.errors

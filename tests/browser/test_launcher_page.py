"""Lesson 1.17 in a real Chromium on the real trainer: two runs of two data-parallel ranks
each, whose Crash test kills rank 1 alone. A's launcher takes the group down at once; B's
leaves rank 0 waiting in its collective, and the event log counts down to the timeout
before the group restarts. Both resume bit-identically."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import LabServer
from tests.support.browser_lab import crash, press_crash, start, stop_both, wait_check

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def test_lesson_1_17_b_s_log_counts_down_the_collective_timeout_and_both_resume_exactly(
    lab_server: LabServer, page: Any
) -> None:
    start(page, lab_server.url + "/lesson/lesson-1.17")
    try:
        assert "collective_timeout_s" in page.locator("body").inner_text()
        # B first: its first Crash test holds both runs while the question is open, so the
        # kill lands where the hold stopped it (past the checkpoint at 50); pressed second,
        # B's kill once landed on its checkpoint at 100 and recomputed nothing.
        press_crash(page, "B", 60)  # rank 1 alone; rank 0 waits for it
        waiting = page.locator("#events li.run-B[data-code=rank_lost_waiting]")
        waiting.filter(has_text="the survivors' collective times out in").wait_for()
        note = waiting.locator(".event-note").inner_text()
        # B's card says the same of its ranks: rank 1 lost, rank 0 waiting in its collective.
        card = page.locator(".run-card.run-B .ranks")
        card.locator("li[data-rank='0'][data-state=waiting]").wait_for(timeout=15_000)
        card.locator("li[data-rank='1'][data-state=lost]").wait_for(timeout=5_000)
        waiting_words = " ".join(card.locator("li[data-rank='0']").inner_text().split())
        crash(page, "A", 60)
        waiting.filter(has_text="the collective timed out after").wait_for(timeout=60_000)
        wait_check(page, lab_server, "A", identical=True)
        wait_check(page, lab_server, "B", identical=True)
    except BaseException:
        stop_both(page)
        raise
    assert "times out in" in note, note
    assert "in its collective, times out in" in waiting_words, waiting_words
    assert not page.locator("#events li.run-A[data-code=rank_lost_waiting]").count()
    errors = list(page.errors)  # before the stop: a run that has finished answers it 409
    stop_both(page)
    assert errors == []

"""Lesson 1.16 in a real Chromium on the real trainer: two runs of two data-parallel ranks
each. A student crashes both; A's resume check is bit-identical on every rank, B's names
rank 1 as the first rank that left the original (rank 0 saved the RNG and data cursor for
all), and what B's checkpoint did not hold is rank 1's own state."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import LabServer
from tests.support.browser_lab import crash, start, stop_both, wait_check

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def test_lesson_1_16_b_s_check_names_rank_1_and_a_s_is_bit_identical_on_both_ranks(
    lab_server: LabServer, page: Any
) -> None:
    start(page, lab_server.url + "/lesson/lesson-1.16")
    try:
        assert "two data-parallel ranks" in page.locator("body").inner_text()
        # B first: its first Crash test holds both runs while the question is open, so the
        # kill lands where B was held, past its checkpoint at 50. Pressed second, B could be
        # anywhere, and a kill landing on its checkpoint at 100 recomputes nothing; every
        # later resume then starts from rank 0's state again and matches the one before it.
        crash(page, "B", 60)
        crash(page, "A", 60)
        a = wait_check(page, lab_server, "A", identical=True)
        b = wait_check(page, lab_server, "B", identical=False)
    except BaseException:
        stop_both(page)
        raise
    a.locator(".check-verdict").filter(has_text="Bit-identical").wait_for()
    verdict = b.locator(".check-verdict").inner_text()
    assert "Rank 1 of the 2 ranks differed first, at step" in verdict, verdict
    assert "rank 1's RNG states, rank 1's data position" in verdict, verdict
    stop_both(page)
    assert page.errors == []

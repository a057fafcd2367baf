"""Lesson 1.18 in a real Chromium on the real trainer: two runs of two data-parallel ranks,
restarted on one rank by their Crash test. A's resume check says it resharded, is not
bit-identical and why, and gives max |Δloss| within the stated tolerance; B's entry says
its checkpoint was written by 2 ranks and this run has 1, and that it refused it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import LabServer
from tests.support.browser_lab import RUN_MS, crash, start, stop_both, wait_check

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def test_lesson_1_18_a_reshards_onto_one_rank_within_tolerance_and_b_refuses_its_rank_files(
    lab_server: LabServer, page: Any, tmp_path: Path
) -> None:
    start(page, lab_server.url + "/lesson/lesson-1.18")
    try:
        assert "one rank instead of two" in page.locator("body").inner_text()
        # B first: the first Crash test holds both runs while the question is open, so A's
        # kill lands where A was held, past its checkpoint at 50, with steps to recompute.
        crash(page, "B", 60, recompute=False)
        crash(page, "A", 60)
        a = wait_check(page, lab_server, "A", identical=False)
        refused = page.locator("#resume-checks li.run-B.check-refused")
        refused.wait_for(timeout=RUN_MS)
    except BaseException:
        # A flake must leave its cause: what the page said, then the server's log.
        print(f"page errors: {page.errors}\n--- page ---\n{page.locator('body').inner_text()}")
        print(f"--- server log ---\n{lab_server.output()[-6000:]}")
        stop_both(page)
        raise
    verdict = a.locator(".check-verdict").inner_text()
    assert "Resumed on 1 rank from a checkpoint of 2 ranks" in verdict, verdict
    assert "Not bit-identical, and it cannot be: the same global samples" in verdict, verdict
    assert "within the stated tolerance of 1.0e-4" in verdict, verdict
    # within the tolerance the lesson promised: not drawn as a red "different"
    assert "check-tolerance" in (a.get_attribute("class") or ""), a.get_attribute("class")
    text = refused.inner_text()
    assert refused.get_attribute("data-evidence") == "world_size", text
    assert "written by 2 ranks, this run has 1" in text and "refused it (exit 2)" in text, text
    log = page.locator("body").inner_text()
    assert "The lesson restarts it with ranks=1" in log
    page.screenshot(path=str(tmp_path / "lesson-1.18.png"), full_page=True)
    page.locator("#cards").screenshot(path=str(tmp_path / "lesson-1.18-cards.png"))
    page.locator("#resume-checks").screenshot(path=str(tmp_path / "lesson-1.18-checks.png"))
    print(f"screenshots in {tmp_path}")
    stop_live(page)
    assert page.errors == []


def stop_live(page: Any) -> None:
    """Stop the runs still live (B has failed: a stop of it would be a 409)."""
    page.evaluate(
        """async () => {
            const pair = new URLSearchParams(location.search).get('pair');
            const view = await (await fetch(`/api/pairs/${pair}`)).json();
            for (const r of view.runs) {
                if (!['finished', 'failed', 'stopped', 'diverged'].includes(r.state)) {
                    await fetch(`/api/runs/${r.id}/stop`, {method: 'POST'});
                }
            }
        }"""
    )

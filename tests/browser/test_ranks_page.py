"""Lesson 1.16 in a real Chromium on the real trainer: two runs of two data-parallel ranks
each. A student crashes both; A's resume check is bit-identical on every rank, B's names
rank 1 as the first rank that left the original (rank 0 saved the RNG and data cursor for
all), and what B's checkpoint did not hold is rank 1's own state."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import LabServer
from tests.support.browser_lab import (
    RUN_MS,
    crash,
    run_view,
    skip_prediction,
    start,
    stop_both,
    wait_check,
    wait_step,
)

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


def crash_event(page: Any, label: str) -> dict[str, Any]:
    events: list[dict[str, Any]] = page.evaluate(
        "async (id) => (await (await fetch(`/api/runs/${id}/events`)).json()).events",
        run_view(page, label)["id"],
    )
    return next(e for e in events if e["code"] == "crash")


# Every change of the card's rank lines, in order: a snapshot of "rank:state" for each rank.
WATCH_RANKS = """(label) => {
    const ul = document.querySelector(`.run-card.run-${label} .ranks`);
    const seen = (window.rankSnapshots = []);
    const snap = () => [...ul.querySelectorAll('li')].map((li) => li.dataset.state).join(',');
    new MutationObserver(() => {
        const s = snap();
        if (seen[seen.length - 1] !== s) seen.push(s);
    }).observe(ul, {subtree: true, attributes: true, childList: true});
}"""


def test_lesson_1_16_s_kill_one_rank_shows_that_rank_lost_then_the_group_restarting_then_training(
    lab_server: LabServer, page: Any, tmp_path: Any
) -> None:
    start(page, lab_server.url + "/lesson/lesson-1.16")
    try:
        b = run_view(page, "B")
        page.evaluate("async (id) => fetch(`/api/runs/${id}/stop`, {method: 'POST'})", b["id"])
        ranks = page.locator(".run-card.run-A .ranks li")
        page.locator(".run-card.run-A .ranks li[data-state=training]").nth(1).wait_for(
            timeout=RUN_MS
        )
        assert ranks.count() == 2
        words = " ".join(ranks.nth(0).inner_text().split())
        assert words.startswith("rank 0 training"), words
        # Its process's telemetry: the CPU share from the second reading on.
        ranks.filter(has_text="% CPU").nth(1).wait_for(timeout=30_000)
        page.locator("#cards").screenshot(path=str(tmp_path / "ranks-laptop.png"))
        page.evaluate(WATCH_RANKS, "A")
        wait_step(page, "A", 60)
        page.locator(".run-A .crash-offer[data-mode=rank]").click()
        skip_prediction(page)
        crashed = page.locator("#events li.run-A[data-code=crash]")
        crashed.filter(has_text="Crash test: killed rank").wait_for(timeout=RUN_MS)
        try:
            page.wait_for_function(
                """() => {
                    const s = window.rankSnapshots;
                    const back = s[s.length - 1] === 'training,training';
                    return back && s.some((x) => x.includes('lost'));
                }""",
                timeout=RUN_MS,
            )
        except Exception as e:  # Playwright's TimeoutError: say what the card went through
            seen = page.evaluate("window.rankSnapshots")
            pytest.fail(f"rank states seen: {seen}\n{e}\n{run_view(page, 'A')}")
        snapshots = page.evaluate("window.rankSnapshots")
        page.set_viewport_size({"width": 390, "height": 844})
        page.locator(".run-card.run-A").screenshot(path=str(tmp_path / "ranks-phone.png"))
        page.locator(".control.run-A").screenshot(path=str(tmp_path / "controls-phone.png"))
        print(f"rank states seen: {snapshots}; screenshots in {tmp_path}")
    except BaseException:
        stop_both(page)
        raise
    killed = int(crash_event(page, "A")["fields"]["lost_rank"])
    assert f"killed rank {killed} of 2" in crashed.inner_text()
    lost = next(i for i, s in enumerate(snapshots) if s.split(",")[killed] == "lost")
    assert "restarting" in ",".join(snapshots[lost:]), snapshots  # the group, then
    assert snapshots[-1] == "training,training", snapshots
    errors = list(page.errors)  # before the stop: B, stopped already, answers it 409
    stop_both(page)
    assert errors == []

"""Words that match the run (issue #37 §2), in a real Chromium on the real trainer, lessons
1.10 (a kill armed for the next checkpoint write; B's in-place checkpoint is torn and
nothing older is left), 1.14 (the session wall: A stops gracefully, B dies on the SIGTERM)
and 1.15 on a lab of one machine (the disk goes with the kill; A has no mirror): every
text under the buttons, badge and card rate is recorded as it changed (a
MutationObserver, `window.words`), and the tests read the whole trail.

- the hint under Crash test follows the lesson's crash mode, never "SIGKILL now" for 1.10;
- after a kill the line under the buttons says what happened, and what the restart did
  only once it did it: never "It resumes", and a run that refused says so beside "failed";
- the event log says "no older checkpoint to fall back to" when there is none, and no
  supervisor event claims a resume before the trainer wrote one;
- the crash window is named by its steps (the preset's `[crash] window`);
- the card's tokens/s and MFU after a resume are the restarted process's own steps: MFU
  never above 100 %, the card never faster than the fastest step it trained;
- a graceful stop that lost nothing says what it saved (the log and the resume check),
  never "cost 0 steps"; one that lost steps counts them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, serve_lab
from tests.support.browser_lab import RUN_MS, skip_prediction, start, stop_both, wait_step

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]

# Each row: [badge, text under the buttons, crash window, card tokens/s, card MFU].
WORDS_JS = """() => {
    window.words = {A: [], B: []};
    const q = (s) => document.querySelector(s)?.textContent ?? "";
    const snap = (L) => {
        const row = [q(`.control.run-${L} .badge`), q(`.control.run-${L} .crash-why`),
            q(`.control.run-${L} .crash-window`), q(`.run-card.run-${L} [data-m=tps]`),
            q(`.run-card.run-${L} [data-m=mfu]`)];
        const t = window.words[L];
        const last = t[t.length - 1];
        if (!last || row.some((v, i) => v !== last[i])) t.push(row);
    };
    snap("A"); snap("B");
    new MutationObserver(() => { snap("A"); snap("B"); })
        .observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "words")


def words(page: Any, label: str) -> list[list[str]]:
    rows: list[list[str]] = page.evaluate("(l) => window.words[l]", label)
    return rows


def event_texts(page: Any, label: str, code: str) -> list[str]:
    return page.locator(f"#events li.run-{label}[data-code={code}] .event-text").all_inner_texts()


def press(page: Any, label: str, after_step: int) -> None:
    wait_step(page, label, after_step)
    page.wait_for_function(
        "(l) => !document.querySelector(`.run-${l} .crash`).disabled", arg=label, timeout=RUN_MS
    )
    page.locator(f".run-{label} .crash").click()
    skip_prediction(page)


def said(page: Any, label: str, text: str) -> None:
    page.wait_for_function(
        "([l, t]) => window.words[l].some((r) => r[1].includes(t))",
        arg=[label, text],
        timeout=RUN_MS,
    )


def assert_no_promise(page: Any) -> None:
    """No text under the buttons promised a resume, and no restart event claimed one."""
    for label in "AB":
        rows = words(page, label)
        assert not [r for r in rows if "It resumes" in r[1] or "resumes from" in r[1]], rows
        for code in ("crash", "lost_host"):
            for text in event_texts(page, label, code):
                assert "Resuming" not in text and "resumed" not in text, text


def percent(text: str) -> float | None:
    m = re.match(r"([\d.]+)\s*%", text.strip())
    return float(m.group(1)) if m else None


_UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def rate(text: str) -> float | None:
    """The card's tokens/s ("7.7k", "950") as a number; None for "–" or "held"."""
    m = re.fullmatch(r"([\d.]+)([kMG]?)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def fastest_step(page: Any, label: str) -> float:
    """The highest tokens/s of any step record the run wrote (every process of it)."""
    fastest: float = page.evaluate(
        """async (label) => {
            const pair = new URLSearchParams(location.search).get('pair');
            const view = await (await fetch(`/api/pairs/${pair}`)).json();
            const run = view.runs.find((r) => r.label === label);
            const got = await (await fetch(`/api/runs/${run.id}/records?kind=step`)).json();
            return Math.max(0, ...got.records.map((r) => r.tokens_per_s ?? 0));
        }""",
        label,
    )
    return fastest


def assert_card_never_faster_than_a_step(page: Any, label: str) -> None:
    """The card's tokens/s, every value it showed, is at most the fastest step record (the
    card rounds to two or three digits: "7.7k" may stand for 7,650)."""
    fastest = fastest_step(page, label)
    shown = [(r[3], x) for r in words(page, label) if (x := rate(r[3])) is not None]
    assert shown and fastest > 0, (shown, fastest)
    too_fast = [text for text, x in shown if x > fastest * 1.01]
    assert not too_fast, (too_fast, fastest)


def test_lesson_1_10_the_hint_waits_for_the_write_and_b_s_log_has_nothing_to_fall_back_to(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.10")
    page.evaluate(WORDS_JS)
    try:
        wait_step(page, "A", 20)
        hint = page.locator(".run-A .crash-why").inner_text()
        assert "next checkpoint write" in hint and "SIGKILL now" not in hint, hint
        assert "window, steps 100–600" in page.locator(".run-A .crash-window").inner_text()
        for label in "AB":
            press(page, label, 110)
        said(page, "A", "; resumed from the checkpoint at step")
        said(page, "B", "refused to start (exit 3)")
        page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=RUN_MS)
    except BaseException:
        stop_both(page)
        raise
    # B: its only checkpoint was torn; the log says there was nothing older.
    (rejected,) = event_texts(page, "B", "ckpt_corrupt")
    assert rejected.endswith("There is no older checkpoint to fall back to."), rejected
    assert "Falling back" not in rejected
    (b_crash,) = event_texts(page, "B", "crash")
    assert "restarting the trainer to load it" in b_crash, b_crash
    assert page.locator(".run-B .badge").inner_text() == "failed"
    b_rows = words(page, "B")
    refused = next(r for r in b_rows if "refused to start" in r[1])
    assert refused[1].startswith("Killed process") and "in the middle of writing" in refused[1]
    assert "rejected its checkpoint (it failed its checks), found nothing older" in refused[1]
    assert_no_promise(page)
    for label in "AB":
        rows = words(page, label)
        hit = [r for r in rows if "inside the lesson's window, steps 100–600 ✓" in r[2]]
        assert hit, rows
        mfu = [p for r in rows if (p := percent(r[4])) is not None]
        assert mfu and max(mfu) <= 100, mfu
    assert page.errors == []


def test_lesson_1_15_on_one_machine_the_hint_names_the_disk_and_a_s_card_agrees_with_failed(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.15")
    page.evaluate(WORDS_JS)
    try:
        wait_step(page, "B", 20)
        for label in "AB":
            hint = page.locator(f".run-{label} .crash-why").inner_text()
            assert "disk" in hint and "mirror" in hint and "SIGKILL now:" not in hint, hint
        # B's checkpoint of step 100 copied to the mirror first (its log says so).
        page.locator("#events li.run-B", has_text="copied to the mirror").first.wait_for(
            timeout=RUN_MS
        )
        for label in "AB":
            press(page, label, 110)
        said(page, "A", "refused to start (exit 3)")
        said(page, "B", "; resumed from the checkpoint at step 100")
        page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=RUN_MS)
    except BaseException:
        stop_both(page)
        raise
    assert page.locator(".run-A .badge").inner_text() == "failed"
    a_rows = words(page, "A")
    # Beside "failed", the line under A's buttons says the restart refused: never "resumes".
    failed = [r for r in a_rows if r[0] == "failed" and r[1].startswith("Killed process")]
    assert all("refused to start" in r[1] for r in failed), failed
    assert_no_promise(page)
    # B resumed: its card's rates are its own steps' (never the first, at start priority).
    mfu = [p for r in words(page, "B") if (p := percent(r[4])) is not None]
    assert mfu and max(mfu) <= 100, mfu
    assert_card_never_faster_than_a_step(page, "B")
    assert page.errors == []


def test_lesson_1_14_a_graceful_stop_says_what_it_saved_and_the_cards_rates_are_real_steps(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.14")
    page.evaluate(WORDS_JS)
    try:
        # Both runs meet the wall at step 300 by themselves; each resumes once.
        for label in "AB":
            page.locator(f"#resume-checks li.check.run-{label} .check-cost").wait_for(
                timeout=RUN_MS
            )
        page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=RUN_MS)
    except BaseException:
        stop_both(page)
        raise
    # A saved the step it stopped at (300, or a step or two later on a busy machine: the
    # lab sends the SIGTERM once it has read step 300): the log and the check say which.
    (a_stop,) = event_texts(page, "A", "preempt")
    saved = re.search(r"The stop lost nothing: it saved step (\d+), the last step it", a_stop)
    assert saved and int(saved.group(1)) >= 300, a_stop
    assert "cost 0 steps" not in page.locator("body").inner_text()
    a_cost = page.locator("#resume-checks li.check.run-A .check-cost").inner_text()
    said = f"Nothing to redo: the stop saved a checkpoint of step {saved.group(1)}"
    assert a_cost.startswith(said), a_cost
    # B had no handler: its stop counts the steps since its only checkpoint (step 0).
    (b_stop,) = event_texts(page, "B", "preempt")
    lost = re.search(r"The stop cost (\d+) steps\.", b_stop)
    assert "ended the trainer on the spot" in b_stop and lost and int(lost.group(1)) >= 300, b_stop
    b_cost = page.locator("#resume-checks li.check.run-B .check-cost").inner_text()
    assert b_cost.startswith(f"The stop cost {lost.group(1)} steps of work"), b_cost
    for label in "AB":
        mfu = [p for r in words(page, label) if (p := percent(r[4])) is not None]
        assert mfu and max(mfu) <= 100, mfu
        assert_card_never_faster_than_a_step(page, label)
    assert page.errors == []

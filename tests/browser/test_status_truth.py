"""The run cards never contradict what happened (issue #23, items 1 and 2), in a real
Chromium on the real trainer: every badge, state line and button text a run showed is
recorded as it changed (a MutationObserver, `window.trail`), and the tests read the whole
trail, not a moment of it.

- a finished run is never "starting" or "resuming" next to "finished" (every lesson);
- a graceful stop or a session wall is "preempted", never "crashed"; a Preempt's grace
  countdown ends with the trainer; the class view counts preemptions and crash tests;
- an armed kill (lesson 1.10) is "kill armed" until it lands; B's refusal names the torn
  checkpoint its manifest rejected and the steps lost;
- an armed kill after a Preempt is still "kill armed" after a reload (the run view's
  `pending_kill`, not a count of crashes), and the class view disables its Crash test;
- on a lab of one machine lesson 1.15 tells the one-machine case and the card names no host;
- while a trainer (re)starts, the card says how long starts take on this lab.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, serve_lab
from tests.support.browser_lab import (
    RUN_MS,
    crash,
    run_view,
    skip_prediction,
    start,
    stop_both,
    wait_step,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]

TOKEN = "status-truth-teacher-token"

# Each row: [badge, state line, text under the buttons, steps, restart events in the log].
TRAIL_JS = """() => {
    const RESTARTS = "[data-code=crash],[data-code=preempt],[data-code=graceful_stop]";
    window.trail = {A: [], B: []};
    const q = (s) => document.querySelector(s)?.textContent ?? "";
    const snap = (L) => {
        const row = [q(`.control.run-${L} .badge`), q(`.run-card.run-${L} .state-line`),
            q(`.control.run-${L} .crash-why`), q(`.control.run-${L} .steps`),
            document.querySelectorAll(`#events li.run-${L}:is(${RESTARTS})`).length];
        const t = window.trail[L];
        const last = t[t.length - 1];
        if (!last || row.some((v, i) => v !== last[i])) t.push(row);
    };
    snap("A"); snap("B");
    new MutationObserver(() => { snap("A"); snap("B"); })
        .observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "truth", TOKEN)


def trail(page: Any, label: str) -> list[list[Any]]:
    rows: list[list[Any]] = page.evaluate("(l) => window.trail[l]", label)
    return rows


def step_of(row: list[Any]) -> int:
    return int(str(row[3]).split("/")[0].replace(",", "").strip() or 0)


def wait_done(page: Any) -> None:
    page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=RUN_MS)


ENDED = {"done", "failed", "stopped"}


def assert_never_starting_once_finished(page: Any) -> None:
    """From the first moment a run's card says it ended (done, or failed), its badge never
    says starting, resuming or training again, and "Not training yet (finished)" is never
    shown."""
    for label in "AB":
        rows = trail(page, label)
        finished = [r for r in rows if "(finished)" in r[2]]
        assert not finished, finished
        first = next((i for i, r in enumerate(rows) if r[0] in ENDED), None)
        assert first is not None, f"{label} never showed its end: {rows[-5:]}"
        assert {r[0] for r in rows[first:]} <= ENDED, f"{label} after its end: {rows[first:]}"


def test_a_crash_test_s_run_says_how_long_starts_take_and_never_restarts_once_finished(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/browser?steps=400")
    page.evaluate(TRAIL_JS)
    crash(page, "A", 120)
    # While A's trainer restarted, the card said how long a start takes here (measured).
    rows = trail(page, "A")
    said = [
        r
        for r in rows
        if re.search(r"a start usually takes ≈ [\d.]+ (ms|s) on this lab", r[1] + r[2], re.I)
    ]
    assert said, rows
    assert all(r[0] in ("crashed", "restarting", "resuming", "starting") for r in said), said
    # A check with steps still to recompute is "so far", never the final verdict.
    partial = page.evaluate(
        """async () => {
            const l = await import('/static/lesson.js');
            return l.resumeCheckText('A', {segment: 1, from_step: 100, steps: [101, 124],
                points: 24, expected_points: 300, complete: false, bit_identical: true,
                max_abs_delta: 0, mean_abs_delta: 0, missing: [], fields: [],
                outcome: 'identical_so_far'});
        }"""
    )
    assert partial[2] != "identical" and "so far" in partial[1], partial
    assert not partial[1].startswith("Bit-identical:"), partial
    wait_done(page)
    assert_never_starting_once_finished(page)
    assert page.errors == []


def test_lesson_1_14_a_wall_and_a_preempt_are_preemptions_counted_in_the_class_view(
    lab: LabServer, page: Any, browser: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.14")
    page.evaluate(TRAIL_JS)
    try:
        wait_step(page, "B", 60)
        page.wait_for_function(
            "() => !document.querySelector('.run-B .preempt').disabled", timeout=RUN_MS
        )
        page.locator(".run-B .preempt").click()
        skip_prediction(page)  # asked before the first crash test or preemption
        # B has no SIGTERM handler: it dies at once, and its countdown ends with it.
        page.locator("#events li.run-B[data-code=preempt]").first.wait_for(timeout=RUN_MS)
        wait_done(page)
    except BaseException:
        stop_both(page)  # the runs ended on their own otherwise (a stop then is a 409)
        raise
    for label in "AB":
        rows = trail(page, label)
        assert not [r for r in rows if r[0] == "crashed"], f"{label}: {rows}"
    counting = [r for r in trail(page, "B") if r[4] > 0 and "grace before SIGKILL" in r[2]]
    assert not counting, counting
    assert_never_starting_once_finished(page)
    assert page.errors == []

    pair = re.search(r"pair=([\w-]+)", page.url)
    assert pair
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    teacher = context.new_page()
    try:
        teacher.goto(lab.url + "/instructor")
        teacher.locator("#token").fill(TOKEN)
        teacher.locator("#login-form button").click()
        teacher.locator("#new-preset").wait_for(state="visible")
        teacher.goto(lab.url + "/class")
        row = teacher.locator(f"#class-rows tr[data-pair='{pair.group(1)}']")
        row.wait_for()
        cells = row.locator("td.class-run")
        # A: the session wall's graceful stop; B: the Preempt button (the wall hits a
        # run's first process only, and B's had ended).
        assert "1 preemption" in cells.nth(0).inner_text(), cells.nth(0).inner_text()
        assert "1 preemption" in cells.nth(1).inner_text(), cells.nth(1).inner_text()
    finally:
        context.close()


def test_lesson_1_10_an_armed_kill_is_armed_until_it_lands_and_b_names_the_torn_file(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.10")
    page.evaluate(TRAIL_JS)
    try:
        for label in "AB":
            wait_step(page, label, 110)
            page.wait_for_function(
                "(l) => !document.querySelector(`.run-${l} .crash`).disabled",
                arg=label,
                timeout=RUN_MS,
            )
            page.locator(f".run-{label} .crash").click()
            skip_prediction(page)  # lesson 1.10 asks one before its first crash test
            page.wait_for_function(
                "(l) => window.trail[l].some((r) => r[0] === 'kill armed')", arg=label
            )
            line = next(r[1] for r in trail(page, label) if r[0] == "kill armed")
            assert re.search(r"SIGKILL at the next checkpoint write \(step \d+00\)", line), line
        why = page.locator(".run-A .crash-why")
        why.filter(has_text="in the middle of writing the checkpoint for step").wait_for(
            timeout=RUN_MS
        )
        refused = page.locator("#resume-checks li.run-B.check-refused")
        refused.wait_for(timeout=RUN_MS)
        wait_done(page)
    except BaseException:
        stop_both(page)  # the runs ended on their own otherwise (a stop then is a 409)
        raise
    text = refused.inner_text()
    assert refused.get_attribute("data-evidence") == "torn", text
    assert "manifest" in text and "sha256" in text, text
    assert re.search(r"all \d[\d,]* steps it had trained were lost", text), text
    assert "no compute wasted" not in text
    for label in "AB":
        rows = trail(page, label)
        armed = [i for i, r in enumerate(rows) if r[0] == "kill armed"]
        assert armed, rows
        # Armed, it trained on: the kill landed at a later step than the one it was armed
        # at (the crash event's, as the card says it; how many steps the page drew while
        # armed is up to its render cadence). No "crashed" until that event came.
        said = [m for r in rows if (m := re.search(r"Killed process \d+ at step ([\d,]+)", r[2]))]
        assert said, rows
        at = int(said[0].group(1).replace(",", ""))
        assert at > step_of(rows[armed[0]]), (at, rows[armed[0]])
        landed = next(i for i, r in enumerate(rows) if r[4] > 0)
        assert not [r for r in rows[:landed] if r[0] == "crashed"], rows[:landed]
    assert_never_starting_once_finished(page)
    assert page.errors == []


def test_after_a_preempt_an_armed_crash_test_stays_armed_on_reload_and_in_the_class_view(
    lab: LabServer, page: Any, browser: Any, tmp_path: Any
) -> None:
    start(page, lab.url + "/lesson/browser-armed")
    try:
        wait_step(page, "A", 20)
        page.wait_for_function(
            "() => !document.querySelector('.run-A .preempt').disabled", timeout=RUN_MS
        )
        page.locator(".run-A .preempt").click()
        why = page.locator(".run-A .crash-why")
        why.filter(has_text="The stop lost nothing: it saved step").wait_for(timeout=RUN_MS)
        # Segment 1 trains: Crash test again, armed until the write of step 800.
        page.wait_for_function(
            "() => !document.querySelector('.run-A .crash').disabled", timeout=RUN_MS
        )
        page.locator(".run-A .crash").click()
        badge = page.locator(".control.run-A .badge")
        badge.filter(has_text="kill armed").wait_for()
        page.reload()
        badge.filter(has_text="kill armed").wait_for()
        line = page.locator(".run-card.run-A .state-line").inner_text()
        assert "SIGKILL at the next checkpoint write (step 800)" in line, line
        view = run_view(page, "A")
        # One crash test, one preemption: a count of crashes against segments says nothing.
        assert (view["segment"], view["crashes"]) == (1, 1), view
        assert view["pending_kill"]["armed"] and not view["can_crash"], view
        page.screenshot(path=str(tmp_path / "student-armed.png"))

        pair = re.search(r"pair=([\w-]+)", page.url)
        assert pair
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        teacher = context.new_page()
        try:
            teacher.goto(lab.url + "/instructor")
            teacher.locator("#token").fill(TOKEN)
            teacher.locator("#login-form button").click()
            teacher.locator("#new-preset").wait_for(state="visible")
            teacher.goto(lab.url + "/class")
            cell = teacher.locator(f"#class-rows tr[data-pair='{pair.group(1)}'] td.run-A")
            cell.wait_for()
            button = cell.locator("button.crash")
            assert button.is_disabled()
            title = button.get_attribute("title") or ""
            assert "Crash test armed" in title and "next checkpoint write" in title, title
            teacher.screenshot(path=str(tmp_path / "class-armed.png"))
            print("screenshots:", tmp_path)
        finally:
            context.close()
        # Still armed when the class view was read: the kill had not landed.
        assert run_view(page, "A")["pending_kill"]["armed"]
    finally:
        stop_both(page)
    assert page.errors == []


def test_lesson_1_15_on_one_machine_tells_the_one_machine_case_and_names_no_host(
    lab: LabServer, page: Any
) -> None:
    start(page, lab.url + "/lesson/lesson-1.15")
    try:
        watch = page.locator("#what-to-watch").inner_text()
        assert "one machine" in watch and "another host" not in watch, watch
        explanation = page.locator("#lesson-explanation").text_content() or ""
        assert "one machine" in explanation and "on its new host" not in explanation
        for label in "AB":
            wait_step(page, label, 20)
        host = socket.gethostname()
        for label in "AB":
            shape = page.locator(f".run-card.run-{label} .shape").inner_text()
            assert f"on {host}" not in shape, shape
    finally:
        stop_both(page)
    assert page.errors == []

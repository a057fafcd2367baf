"""Smaller frictions of the lab (issue 37 §3) in a real Chromium: a duplicated preset gets
a number of its own; the lock panel is grouped by config section with "lock all"; every
invalid keystroke in the editor costs no failed request in the console; on a phone the
lesson picker is not cut mid-word and what a student reads once is folded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, open_page, serve_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "browser-frictions-teacher-token"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "frictions", TOKEN)


def test_a_duplicate_is_numbered_apart_and_its_locks_are_grouped_with_lock_all(
    lab: LabServer, browser: Any
) -> None:
    teacher = open_page(browser)
    teacher.goto(lab.url + "/instructor")
    teacher.locator("#token").fill(TOKEN)
    teacher.locator("#login-form button").click()
    teacher.locator("#preset-rows tr[data-preset=quick] .dup").click()
    teacher.locator("#preset-rows tr[data-preset=quick-copy]").wait_for()
    assert 'number = "0.1.1"' in teacher.locator("#preset-text").input_value()
    row = teacher.locator("#preset-rows tr[data-preset=quick-copy]")
    assert row.locator("td").first.inner_text().startswith("0.1.1 · ")
    groups = teacher.locator("#lock-boxes .lock-group")
    sections = groups.evaluate_all("gs => gs.map(g => g.dataset.section)")
    assert sections[0] == "knob" and {"model", "optim", "checkpoint", "eval"} <= set(sections)
    evals = teacher.locator("#lock-boxes .lock-group[data-section=eval]")
    evals.locator(".lock-all").set_checked(False)
    boxes = evals.locator("input[data-setting]")
    assert boxes.count() >= 3 and not any(b.is_checked() for b in boxes.all())
    evals.locator(".lock-all").set_checked(True)
    assert all(b.is_checked() for b in boxes.all())
    # an always-locked setting stays ticked and cannot be cleared by "lock all"
    model = teacher.locator("#lock-boxes .lock-group[data-section=model]")
    model.locator(".lock-all").set_checked(False)
    assert model.locator("input[data-setting=n_layer]").is_checked()
    assert teacher.errors == []
    teacher.context.close()


def test_invalid_keystrokes_in_the_editor_log_no_failed_request(
    lab: LabServer, browser: Any
) -> None:
    teacher = open_page(browser)
    teacher.goto(lab.url + "/instructor")
    teacher.locator("#token").fill(TOKEN)
    teacher.locator("#login-form button").click()
    teacher.locator("#new-preset").click()
    teacher.locator("#validation[data-state=ok]").wait_for()
    answers: list[int] = []
    teacher.on(
        "response", lambda r: answers.append(r.status) if "presets/validate" in r.url else None
    )
    area = teacher.locator("#preset-text")
    area.press("Control+End")
    area.press_sequentially("\n[bogus\n", delay=40)  # every keystroke invalid TOML
    error = teacher.locator("#validation[data-state=error]")
    error.wait_for()
    assert "not valid TOML" in error.inner_text()
    assert teacher.locator("#save").is_disabled()
    assert answers and set(answers) == {200}, answers
    assert len(answers) < 8, f"{len(answers)} checks for 8 keystrokes: not debounced"
    assert teacher.errors == [], teacher.errors
    teacher.context.close()


def test_on_a_phone_the_picker_is_not_cut_and_what_is_read_once_is_folded(
    lab: LabServer, browser: Any
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(lab.url + "/?new=1&preset=lesson-1.15")
    page.locator("#start:not([disabled])").wait_for()
    shown = page.locator("#preset option:checked").inner_text()
    assert shown == "1.15 · Lose the machine"
    fits = page.locator("#preset").evaluate("s => s.scrollWidth <= s.clientWidth + 1")
    assert fits, "the closed picker shows its whole text"
    folded = page.locator("details[data-fold=phone]")
    assert folded.count() >= 5
    assert not any(d.evaluate("d => d.open") for d in folded.all())
    assert page.locator("#what-to-watch").is_visible()  # read while watching: not folded
    page.locator("details[data-fold=phone] summary", has_text="What's happening").click()
    assert page.locator("#whats-happening").is_visible()
    context.close()
    laptop = open_page(browser)
    laptop.goto(lab.url + "/?new=1&preset=lesson-1.15")
    laptop.locator("#start:not([disabled])").wait_for()
    assert laptop.locator("#whats-happening").is_visible()  # a laptop shows it all
    assert "local checkpoints vs mirrored" in laptop.locator("#preset option:checked").inner_text()
    laptop.context.close()

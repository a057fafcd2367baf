"""Predict, then crash (issue #23, item 3) in a real Chromium with the real trainer: the
lesson's answer cannot be opened before the outcome; the first Crash test asks the
lesson's question and is sent once it is answered; the answer is stored with the pair and
shown beside what each run's restart measured; the class view shows the class's
predictions against the outcomes; an instructor writes the question in the editor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, open_page, serve_lab
from tests.support.browser_lab import RUN_MS, resume_check, run_view, wait_step

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "browser-predict-teacher-token"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "predict", TOKEN)


def new_page(browser: Any) -> Any:
    return open_page(browser)


def click_crash(page: Any, label: str, after_step: int) -> None:
    wait_step(page, label, after_step)
    page.wait_for_function(
        "(l) => !document.querySelector(`.run-${l} .crash`).disabled", arg=label, timeout=RUN_MS
    )
    page.locator(f".run-{label} .crash").click()


def test_the_first_crash_test_asks_the_prediction_and_the_outcome_is_shown_beside_it(
    lab: LabServer, browser: Any, vendor_built: None
) -> None:
    page = new_page(browser)
    page.goto(lab.url + "/?new=1&preset=browser-predict")
    page.locator("#start:not([disabled])").click()
    page.locator(".run-card.run-B").wait_for()
    question = page.locator("#predict .predict-question")
    question.wait_for()
    assert "How many steps will each run lose" in question.inner_text()

    # The answer stays shut before the outcome: a click on it does not open it.
    page.locator("#answer summary").click()
    assert not page.locator("#answer").evaluate("d => d.open")
    assert "opens once the outcome is in" in page.locator("#answer .answer-note").inner_text()

    # Crash test first asks; the kill is sent once the prediction is saved.
    click_crash(page, "A", 120)
    page.locator("#predict[data-asking=true]").wait_for()
    assert page.locator(".run-A .crash-why").filter(has_text="Killed process").count() == 0
    page.locator("#predict input[name=A]").fill("30")
    page.locator("#predict input[name=B]").fill("-4")
    page.locator("#predict .predict-submit").click()  # the browser refuses -4 (min 0)
    assert page.locator("#predict[data-asking=true]").count() == 1
    page.locator("#predict input[name=B]").fill("100")
    page.locator("#predict .predict-submit").click()
    page.locator(".run-A .crash-why").filter(has_text="Killed process").wait_for()
    # B's crash is not asked again
    click_crash(page, "B", 250)
    page.locator(".run-B .crash-why").filter(has_text="Killed process").wait_for()
    assert page.locator("#predict[data-state=made]").count() == 1

    # Beside the outcome: each run's measured steps are its resume check's lost steps.
    for label, guess in (("A", "30 steps"), ("B", "100 steps")):
        row = page.locator(f"#predict .predict-result tr[data-run={label}]")
        assert row.locator(".predicted").inner_text() == guess
        page.wait_for_function(
            "(l) => /step/.test(document.querySelector(`#predict tr[data-run=${l}] .measured`)"
            ".textContent) && !/waiting/.test(document.querySelector(`#predict tr[data-run=${l}]"
            " .measured`).textContent)",
            arg=label,
            timeout=RUN_MS,
        )
        check = resume_check(page, run_view(page, label)["id"], 1)
        assert check is not None
        lost = check["expected_points"]
        assert row.locator(".measured").inner_text() == f"{lost} step{'' if lost == 1 else 's'}"
        assert row.locator(".verdict").inner_text() in ("✓ as predicted", "✗ not as predicted")

    # Stored with the pair: a reload shows it again, and the answer opens once it is in.
    page.reload()
    page.locator("#predict .predict-result tr[data-run=A] .predicted").filter(
        has_text="30 steps"
    ).wait_for()
    page.locator("#answer[data-outcome=ready]").wait_for(timeout=RUN_MS)
    page.locator("#answer summary").click()
    assert page.locator("#answer").evaluate("d => d.open")
    assert page.errors == []

    # The class sees the prediction against the outcome, under its lesson.
    teacher = new_page(browser)
    teacher.goto(lab.url + "/instructor")
    teacher.locator("#token").fill(TOKEN)
    teacher.locator("#login-form button").click()
    teacher.locator("#new-preset").wait_for(state="visible")
    teacher.goto(lab.url + "/class")
    lesson = teacher.locator("#class-predictions .lesson-predictions[data-preset=browser-predict]")
    lesson.wait_for()
    assert "How many steps will each run lose" in lesson.inner_text()
    cell = lesson.locator("td.run-A").first
    assert cell.inner_text().startswith("30 steps → ")
    assert teacher.errors == []
    page.context.close()
    teacher.context.close()


def test_an_instructor_writes_the_question_and_new_preset_opens_the_editor_in_view(
    lab: LabServer, browser: Any
) -> None:
    teacher = new_page(browser)
    teacher.goto(lab.url + "/instructor")
    teacher.locator("#token").fill(TOKEN)
    teacher.locator("#login-form button").click()
    teacher.locator("#new-preset").click()
    # The editor scrolled into view, the cursor in its text.
    teacher.wait_for_function("() => document.activeElement?.id === 'preset-text'")
    box = teacher.locator("#preset-text").bounding_box()
    assert box is not None and 0 <= box["y"] < teacher.viewport_size["height"]
    ok = teacher.locator("#validation[data-state=ok]")
    ok.wait_for()
    assert "asks first: “How many steps will each run lose" in ok.inner_text()
    text = teacher.locator("#preset-text").input_value()
    teacher.locator("#preset-text").fill(
        text.replace('measure = "lost_steps"', 'measure = "vibes"')
    )
    error = teacher.locator("#validation[data-state=error]")
    error.wait_for()
    assert "[predict] measure = 'vibes' is not allowed" in error.inner_text()
    assert teacher.errors == []  # the problems come in a 200 answer: no failed request
    teacher.context.close()


def test_a_choice_question_is_answered_from_the_lesson_s_words(
    lab: LabServer, browser: Any
) -> None:
    page = new_page(browser)
    page.goto(lab.url + "/?new=1&preset=lesson-1.12")
    page.locator("#start:not([disabled])").click()
    form = page.locator("#predict .predict-form")
    form.wait_for()
    choices = form.locator("select[name=A] option").all_inner_texts()
    assert choices == [
        "choose…",
        "resumes, bit-identical",
        "resumes, but not bit-identical",
        "starts over from step 0",
        "refuses to start (an error)",
    ]
    form.locator("select[name=A]").select_option("refused")
    form.locator("select[name=B]").select_option("identical")
    form.locator(".predict-submit").click()
    page.locator("#predict[data-state=made]").wait_for()
    page.reload()  # stored with the pair
    row = page.locator("#predict .predict-result tr[data-run=A]")
    row.wait_for()
    assert row.locator(".predicted").inner_text() == "refuses to start (an error)"
    assert "waiting for a crash test" in row.locator(".measured").inner_text()
    page.locator("#stop-pair").click()
    assert page.errors == []
    page.context.close()

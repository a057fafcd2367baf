"""Instructor mode in a real Chromium: log in with the token, write a preset (see the
validation error, fix it), lock the knob, publish; then a student in another browser
context opens the lesson's link, cannot change the locked knob (neither in the page nor
through the API), starts it, and the instructor crash-tests the student's run from the
class view."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, open_page, serve_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "browser-teacher-token"
RUN_MS = 150_000
LESSON = """# Written in the browser test.
id = "class-lesson"
number = "9.5"
chapter = "Checkpointing"
title = "Class lesson"
question = "What does a crash cost when you checkpoint every 50 steps?"
whats_happening = "Two tiny GPTs; run A checkpoints every 50 steps, run B every 150."
what_to_watch = "Crash run A; the resume check compares the recomputed steps."

[run]
n_layer = 2
d_model = 64
n_head = 4
ctx = 64
batch = 8
steps = 300
warmup = 20
eval_every = 100
probe_every = 100
sample_every = 300
threads = 1

[knob]
name = "ckpt_every"
a = 50
b = 150
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "instructor", TOKEN)


def new_page(browser: Any) -> Any:
    return open_page(browser, console=False)


def api(page: Any, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """A request from the page itself (its cookies): {"status", "body"}."""
    result: dict[str, Any] = page.evaluate(
        """async ([method, path, body]) => {
            const init = {method, headers: {"Content-Type": "application/json"}};
            if (body !== null) init.body = JSON.stringify(body);
            const r = await fetch(path, init);
            return {status: r.status, body: await r.json().catch(() => null)};
        }""",
        [method, path, body],
    )
    return result


def test_an_instructor_publishes_a_locked_lesson_and_a_student_runs_it(
    lab: LabServer, browser: Any
) -> None:
    teacher = new_page(browser)
    teacher.goto(lab.url + "/instructor")
    teacher.locator("#token").fill("wrong")
    teacher.locator("#login-form button").click()
    teacher.locator("#login-error").filter(has_text="not the instructor token").wait_for()
    teacher.locator("#token").fill(TOKEN)
    teacher.locator("#login-form button").click()
    teacher.locator("#new-preset").wait_for(state="visible")

    # Write the preset: the server's validation shows under the editor as you type.
    teacher.locator("#new-preset").click()
    teacher.locator("#preset-text").fill(LESSON.replace("n_layer = 2", "n_layer = 0"))
    error = teacher.locator("#validation[data-state=error]")
    error.wait_for()
    assert "n_layer" in error.inner_text() and "0" in error.inner_text()
    assert teacher.locator("#save").is_disabled()
    teacher.locator("#preset-text").fill(LESSON)
    teacher.locator("#validation[data-state=ok]").wait_for()
    teacher.locator("#save:not([disabled])").click()
    teacher.locator("#status").filter(has_text="Saved class-lesson (not published yet)").wait_for()
    teacher.locator("#preset-rows tr[data-preset=class-lesson]").wait_for()

    # Lock the knob only: everything else becomes a student's to change.
    for box in teacher.locator("#lock-boxes input:not([disabled])").all():
        box.set_checked(False)
    teacher.locator("#lock-boxes input[data-setting=knob]").check()
    teacher.locator("#save-locks").click()
    teacher.locator("#status").filter(has_text="Locked for students in class-lesson").wait_for()
    assert teacher.locator("#lock-boxes input[data-setting=knob]").is_checked()
    assert not teacher.locator("#lock-boxes input[data-setting=steps]").is_checked()

    # Unpublished: a student's browser sees nothing of it.
    student = new_page(browser)
    student.goto(lab.url + "/")
    student.locator("#start:not([disabled])").wait_for()
    assert "class-lesson" not in student.locator("#preset option").evaluate_all(
        "os => os.map(o => o.value)"
    )
    assert api(student, "GET", "/api/presets/class-lesson")["status"] == 404

    teacher.locator("#publish").click()
    teacher.locator("#status").filter(has_text="Published class-lesson").wait_for()
    teacher.locator("#preset-rows tr[data-preset=class-lesson] .published").wait_for()

    # The student opens the lesson's link, with an unlocked setting in the query.
    student.goto(lab.url + "/lesson/class-lesson?steps=1200")
    student.locator("#start:not([disabled])").wait_for()
    assert student.locator("#lesson-title").inner_text() == "Class lesson"
    settings = student.locator("#lesson-settings")
    assert settings.get_attribute("open") is not None
    knob_inputs = settings.locator("[data-setting=knob] input")
    assert knob_inputs.count() == 2 and all(i.is_disabled() for i in knob_inputs.all())
    assert "locked" in settings.locator("[data-setting=knob]").inner_text()
    assert settings.locator("input[name=steps]").input_value() == "1200"
    assert settings.locator("input[name=steps]").is_enabled()
    link = student.locator("#lesson-link").input_value()
    assert link.endswith("/lesson/class-lesson?steps=1200")
    student.locator("#copy-link").click()
    student.locator("#copy-status").filter(has_text=re.compile("Copied|Selected")).wait_for()

    # The server refuses the locked knob whatever the page shows.
    refused = api(
        student, "POST", "/api/pairs", {"preset": "class-lesson", "overrides": {"knob": {"a": 7}}}
    )
    assert refused["status"] == 403 and "knob is locked" in refused["body"]["detail"]
    other = new_page(browser)
    other.goto(lab.url + "/lesson/class-lesson?knob.a=7")
    other.locator("#status").filter(has_text="not applied").wait_for()
    assert "knob is locked" in other.locator("#status").inner_text()
    other.context.close()

    # Start it: both runs train the student's 1200 steps.
    student.locator("#start").click()
    student.wait_for_url(re.compile(r"\?pair="))
    student.wait_for_function(
        "() => /\\/ 1,200/.test(document.querySelector('.run-A .steps')?.textContent || '')",
        timeout=RUN_MS,
    )
    pair = student.url.split("pair=")[1]
    assert student.locator("#lesson-link").input_value().endswith("/lesson/class-lesson")

    # The class view shows the pair; the instructor crash-tests the student's run A.
    teacher.goto(lab.url + "/class")
    row = teacher.locator(f"#class-rows tr[data-pair='{pair}']")
    row.wait_for()
    assert row.locator("td").first.inner_text() == "student 1"
    assert "Class lesson" in row.inner_text()
    teacher.wait_for_function(
        """(pair) => {
            const td = document.querySelector(`tr[data-pair='${pair}'] td.run-A`);
            const m = td && /step ([\\d,]+)/.exec(td.textContent);
            return m && parseInt(m[1].replace(/,/g, ''), 10) >= 60
                && !td.querySelector('.crash').disabled;
        }""",
        arg=pair,
        timeout=RUN_MS,
    )
    teacher.locator(f"tr[data-pair='{pair}'] td.run-A .crash").click()
    teacher.locator("#status").filter(has_text="Crash test: killed process").wait_for()

    # The student's page shows the resume check of the crash the instructor made.
    check = student.locator("#resume-checks li.run-A.check-identical")
    check.wait_for(timeout=RUN_MS)
    assert "Bit-identical" in check.inner_text()

    # Stop both runs from the class view (they need not finish).
    for label in ("A", "B"):
        stop = teacher.locator(f"tr[data-pair='{pair}'] td.run-{label} .stop")
        teacher.wait_for_function(
            "(sel) => { const b = document.querySelector(sel); return b && !b.disabled; }",
            arg=f"tr[data-pair='{pair}'] td.run-{label} .stop",
        )
        stop.click()
    teacher.wait_for_function(
        """(pair) => [...document.querySelectorAll(`tr[data-pair='${pair}'] td.class-run`)]
            .every((td) => ['stopped', 'finished'].includes(td.dataset.state))""",
        arg=pair,
        timeout=60_000,
    )
    assert teacher.errors == [] and student.errors == []

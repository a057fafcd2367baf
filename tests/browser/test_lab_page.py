"""The lab page in a real Chromium: start a lesson, watch both runs, crash-test them,
read the resume checks, reload mid-run. (Screenshots for the README:
scripts/web_screenshots.py.)
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.browser_lab import crash, wait_step

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

LESSON_S = 180_000  # ms: the whole lesson, both runs, on two busy cores


def step_of(page: Any, label: str) -> int:
    text = page.locator(f".run-{label} .steps").inner_text()
    return int(text.split("/")[0].replace(",", "").strip() or 0)


def event_texts(page: Any, label: str) -> list[str]:
    return page.locator(f"#events li.run-{label} .event-text").all_inner_texts()


def check_line(page: Any, label: str) -> Any:
    return page.locator(f"#resume-checks li.run-{label}")


def test_page_shows_the_lesson_and_a_start_button(lab_server: Any, page: Any) -> None:
    page.goto(lab_server.url + "/?preset=browser")
    page.locator("#start:not([disabled])").wait_for()
    assert page.locator("#lesson-title").inner_text() == "Browser test lesson"
    assert "does a resume really continue" in page.locator("#lesson-question").inner_text()
    assert page.locator("#lesson-knob").inner_text() == "ckpt_every: A 50 vs B 200"
    assert page.locator("#what-to-watch").inner_text().startswith("Crash test A")
    assert page.errors == []


def test_a_lesson_with_a_crash_per_run_resumes_bit_identical_and_survives_reload(
    lab_server: Any, page: Any, vendor_built: None
) -> None:
    page.goto(lab_server.url + "/?preset=browser")
    page.locator("#start:not([disabled])").click()
    page.wait_for_url(re.compile(r"\?pair="))
    page.locator(".run-card.run-B").wait_for()
    assert page.locator(".run-card").count() == 2
    assert page.locator(".run-A .knob-value").inner_text() == "ckpt_every 50"

    # Both cards advance.
    wait_step(page, "A", 5)
    wait_step(page, "B", 5)
    first = (step_of(page, "A"), step_of(page, "B"))
    wait_step(page, "A", first[0] + 20)
    wait_step(page, "B", first[1] + 20)
    assert page.locator(".run-A .shape").inner_text().startswith("builtin · 2L·64d")

    # Crash test A after step 120: it loses the steps since its checkpoint at a multiple of 50
    # (pressed again should a kill land just after a checkpoint and cost none). Meanwhile the
    # page notes what A's card says and when its button comes back, with what it trained.
    watch_run(page, "A")
    crash(page, "A", 120)
    # The restart's wait says how long starts take here (measured by this lab's trainers),
    # and the button comes back with the first step record of the restarted segment.
    page.wait_for_function(
        "() => window.seen.lines.some((l) => /A start usually takes ≈ \\d/.test(l))"
    )
    page.wait_for_function("() => window.seen.enabled.some(([on, seg]) => on && seg >= 1)")
    seen = page.evaluate("() => window.seen")
    after = seen["enabled"][[on for on, _ in seen["enabled"]].index(False) :]
    assert all(seg >= 1 for on, seg in after if on), after  # never on an old segment's record
    starts = page.evaluate("async () => (await (await fetch('/api/health')).json()).start_times")
    assert starts["count"] >= 2 and starts["median_s"] > 0, starts
    events = page.locator("#events li.run-A .event-text")
    events.filter(has_text="Crash test").first.wait_for(timeout=LESSON_S)
    events.filter(has_text=re.compile("^Resumed at step")).first.wait_for(timeout=LESSON_S)
    # The verdict is final once every lost step is recomputed ("so far" before that).
    done = "reproduced the lost steps exactly"
    check_line(page, "A").filter(has_text=done).wait_for(timeout=LESSON_S)
    line = check_line(page, "A").filter(has_text=done).inner_text()
    expected = r"A · resume \d+ steps \d[\d,]*–\d[\d,]* \(\d+ points\): max \|Δloss\| 0\.0e\+0, "
    assert re.search(expected + r"mean 0\.0e\+0", line), line
    assert "the resume reproduced the lost steps exactly" in line
    assert re.search(r"\nloss and \d+ other metrics: bit-identical", line), line  # every field

    # The recomputed segment is drawn dashed over the original, with its data in the table.
    # (Two when the first kill cost no step and `crash` pressed again: each is a series.)
    legend = page.locator("#chart-loss .u-legend .u-series", has_text=re.compile(r"A resume \d"))
    legend.first.wait_for()
    for series in legend.all():
        assert "dashed" in series.locator(".u-marker").get_attribute("style")
    table = page.locator("#chart-loss table.chart-table")
    page.wait_for_function(
        """() => {
            const t = document.querySelector('#chart-loss table.chart-table');
            const heads = [...t.querySelectorAll('thead th')].map(th => th.textContent);
            const col = heads.findIndex(h => /^A resume \\d+$/.test(h));
            return col > 0 && [...t.querySelectorAll('tbody tr')].some(
                tr => tr.children[col] && /\\d/.test(tr.children[col].textContent));
        }"""
    )
    assert "crash test at step" in table.inner_text()

    # Crash test B too, then reload while the runs still train: the history comes back.
    crash(page, "B", 250)
    check_line(page, "B").filter(has_text="Bit-identical").wait_for(timeout=LESSON_S)
    before = {label: step_of(page, label) for label in "AB"}
    events_before = len(event_texts(page, "A")) + len(event_texts(page, "B"))
    assert page.locator("body").get_attribute("data-pair-state") == "running", (
        "lesson ended too soon"
    )
    page.reload()
    page.wait_for_function("() => document.body.dataset.loaded === 'true'")
    for label in "AB":
        assert step_of(page, label) >= before[label]
        check_line(page, label).filter(has_text="Bit-identical").wait_for()
        assert any("Crash test" in t for t in event_texts(page, label))
    assert len(event_texts(page, "A")) + len(event_texts(page, "B")) >= events_before
    resumed_b = page.locator("#chart-loss .u-legend .u-series", has_text=re.compile(r"B resume \d"))
    resumed_b.first.wait_for()

    # And it keeps going live after the reload, to the end.
    page.wait_for_function("() => document.body.dataset.pairState === 'done'", timeout=LESSON_S)
    for label in "AB":
        assert page.locator(f".run-{label} .badge").inner_text() == "done"
        assert page.locator(f".run-{label} .steps").inner_text() == "900 / 900"
        assert page.locator(f".run-{label} .crash").is_disabled()
        assert "Finished" in page.locator(f".run-{label} .crash-why").inner_text()
        stages = page.locator(f".stages.run-{label} li .stage-status").all_inner_texts()
        assert stages == ["done"] * 7, stages
    assert page.locator("#probes tbody tr").count() == 9
    assert page.errors == []


def watch_run(page: Any, label: str) -> None:
    """Note every state line of run `label`'s card, and every time its Crash test button
    turns on or off with the newest segment the page has a step record of, in
    `window.seen` ({lines, enabled: [[on, segment]]})."""
    page.evaluate(
        """(label) => {
            const card = document.querySelector(`.run-card.run-${label}`);
            const ctl = document.querySelector(`.control.run-${label}`);
            const button = ctl.querySelector('.crash');
            const line = card.querySelector('.state-line');
            window.seen = {lines: [line.textContent], enabled: []};
            new MutationObserver(() => window.seen.lines.push(line.textContent))
                .observe(line, {childList: true, characterData: true, subtree: true});
            new MutationObserver(() => window.seen.enabled.push(
                [!button.disabled, parseInt(ctl.dataset.stepSegment, 10)]))
                .observe(button, {attributes: true, attributeFilter: ['disabled']});
        }""",
        label,
    )


def test_without_the_chart_library_the_page_still_tells_the_lesson(
    lab_server: Any, page: Any
) -> None:
    page.route("**/static/vendor/uPlot.iife.min.js", lambda route: route.abort())
    page.goto(lab_server.url + "/?preset=browser")
    page.locator("#start:not([disabled])").click()
    page.wait_for_url(re.compile(r"\?pair="))
    note = page.locator(".no-charts-note")
    note.wait_for()
    assert "Charts are not installed" in note.inner_text()
    wait_step(page, "A", 10)
    page.locator("#events li .event-text").filter(has_text="Training").first.wait_for()
    page.locator("#chart-loss table.chart-table").filter(has_text="A train").wait_for()
    assert page.locator("#chart-loss .uplot").count() == 0
    assert [e for e in page.errors if "uPlot" not in e and "ERR_FAILED" not in e] == []


def test_another_browser_may_watch_a_lesson_but_not_crash_it(
    lab_server: Any, page: Any, browser: Any
) -> None:
    page.goto(lab_server.url + "/?preset=browser")
    page.locator("#start:not([disabled])").click()
    page.wait_for_url(re.compile(r"\?pair="))
    other = browser.new_context(viewport={"width": 390, "height": 844})  # a phone, own cookie
    try:
        watcher = other.new_page()
        watcher.goto(page.url)
        watcher.locator(".run-card.run-A").wait_for()
        assert watcher.locator(".run-A .crash").is_disabled()
        assert "Only the browser that started" in watcher.locator(".run-A .crash-why").inner_text()
        assert "another browser started" in watcher.locator("#status").inner_text()
        width = watcher.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width} px wide on a 390 px phone"
    finally:
        other.close()


def test_numbers_are_formatted_like_the_seed_lab(lab_server: Any, page: Any) -> None:
    page.goto(lab_server.url + "/?preset=browser")
    got = page.evaluate(
        """async () => {
            const f = await import('/static/format.js');
            const c = await import('/static/charts.js');
            return {
                delta: f.sci(0), lr: f.sci(1e-4), ckpt: f.bytes(360.9e6), mem: f.bytes(6.4e9),
                tps: f.compact(33000), mfu: f.pctOfFraction(0.055), tokens: f.int(24576000),
                elapsed: f.duration(487), power: f.usd(0.004), rent: f.usd(0.04),
                kwh: f.kwh(0.02), ema: c.debiasedEma([2, null, 4], 0.5),
            };
        }"""
    )
    ema = got.pop("ema")
    # debiased: the first value is kept as is, not pulled towards 0
    assert ema[:2] == [2, None] and ema[2] == pytest.approx((0.5 * 1 + 0.5 * 4) / 0.75)
    assert got == {
        "delta": "0.0e+0",
        "lr": "1.0e-4",
        "ckpt": "360.9 MB",
        "mem": "6.4 GB",
        "tps": "33k",
        "mfu": "5.5%",
        "tokens": "24,576,000",
        "elapsed": "0:08:07",
        "power": "<$0.01",
        "rent": "$0.04",
        "kwh": "0.020 kWh",
    }

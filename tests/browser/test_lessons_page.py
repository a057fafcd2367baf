"""Lessons end to end in a real Chromium, opened through their shareable links: `quick`
(a full checkpoint: the resume is bit-identical) and lesson 1.8 (run B saves the weights
only: its resume check must show Δ ≠ 0), plus the cadence calculator, its arithmetic
tested through page.evaluate and its panel filled from the running lesson."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

RUN_MS = 180_000


def wait_step(page: Any, label: str, at_least: int) -> None:
    page.wait_for_function(
        """([label, n]) => {
            const e = document.querySelector(`.run-${label} .steps`);
            return e && parseInt(e.textContent.replace(/,/g, ''), 10) >= n;
        }""",
        arg=[label, at_least],
        timeout=RUN_MS,
    )


def crash(page: Any, label: str, after_step: int) -> None:
    wait_step(page, label, after_step)
    page.wait_for_function(
        "(l) => !document.querySelector(`.run-${l} .crash`).disabled", arg=label, timeout=RUN_MS
    )
    page.locator(f".run-{label} .crash").click()
    page.locator(f".run-{label} .crash-why").filter(has_text="Killed process").wait_for()


def start_from_link(page: Any, url: str) -> None:
    page.goto(url)
    page.locator("#start:not([disabled])").click()
    page.wait_for_url(re.compile(r"\?pair="))
    page.locator(".run-card.run-B").wait_for()


def stop_both(page: Any) -> None:
    """Stop the pair's runs so that they do not keep two cores busy after the test."""
    page.evaluate(
        """async () => {
            const pair = new URLSearchParams(location.search).get('pair');
            const view = await (await fetch(`/api/pairs/${pair}`)).json();
            for (const r of view.runs) await fetch(`/api/runs/${r.id}/stop`, {method: 'POST'});
        }"""
    )


def wait_check(page: Any, lab_server: Any, label: str, identical: bool) -> Any:
    """The run's resume check with the given verdict, once shown; on a timeout, fail with
    what the page, the API and the server's log said (a flake must leave its cause)."""
    value = "true" if identical else "false"
    check = page.locator(f"#resume-checks li.run-{label}[data-bit-identical={value}]")
    try:
        check.wait_for(timeout=RUN_MS)
    except Exception as e:  # Playwright's TimeoutError
        state = page.evaluate(
            """async () => {
                const pair = new URLSearchParams(location.search).get('pair');
                const view = await (await fetch(`/api/pairs/${pair}`)).json();
                const checks = {};
                for (const r of view.runs) {
                    checks[r.label] = await (await fetch(`/api/runs/${r.id}/resume-checks`)).json();
                }
                return {view, checks, shown: document.querySelector('#resume-checks').innerText};
            }"""
        )
        pytest.fail(
            f"no {value} resume check for run {label}: {e}\n{state}\n"
            f"--- server log ---\n{lab_server.output()}"
        )
    return check


def max_delta(check: Any) -> float:
    m = re.search(r"max \|Δloss\| ([-+.\de]+)", check.locator(".check-line").inner_text())
    assert m, check.inner_text()
    return float(m.group(1))


def test_the_cadence_arithmetic_follows_the_seed_rule(lab_server: Any, page: Any) -> None:
    page.goto(lab_server.url + "/")
    page.locator("#start:not([disabled])").wait_for()
    got = page.evaluate(
        """async () => {
            const c = await import('/static/cadence.js');
            const seedRule = {budgetMin: 10, secondsPerStep: 1.8, saveSeconds: 1.5, ckptEvery: 100};
            return {
                seed: c.cadence(seedRule),
                bad: c.cadence({budgetMin: 0, secondsPerStep: 1.8, saveSeconds: 1, ckptEvery: 100}),
                frac: c.cadence({budgetMin: 1, secondsPerStep: 1, saveSeconds: 0, ckptEvery: 2.5}),
                sps: c.measuredSecondsPerStep([
                    {step: 30, t: 2}, {step: 10, t: 0}, {step: 20, t: 1}, {step: 40, t: 10}]),
                spsNone: c.measuredSecondsPerStep([{step: 1, t: 0}]),
                save: c.measuredSaveSeconds([
                    {step: 0, seconds: 9}, {step: 50, seconds: 1}, {step: 100, seconds: 3}]),
            };
        }"""
    )
    seed = got["seed"]
    assert seed["suggestedEvery"] == 333  # the seed: 10 min at 1.8 s per step
    assert (seed["avgLostSteps"], seed["worstLostSteps"]) == (50, 100)
    assert seed["avgLostS"] == pytest.approx(90) and seed["worstLostS"] == pytest.approx(180)
    assert seed["saveShare"] == pytest.approx(1.5 / 180) and seed["withinBudget"] is True
    assert got["bad"] == {"error": "budgetMin = 0: minutes > 0"}
    assert "ckptEvery = 2.5" in got["frac"]["error"]
    assert got["sps"] == pytest.approx(0.1)  # the median: the slow interval held a checkpoint
    assert got["spsNone"] is None
    assert got["save"] == pytest.approx(2)  # step 0's checkpoint does not count

    # The panel with typed values (nothing runs on the start view).
    panel = page.locator("#cadence")
    for name, value in (("budget", "10"), ("sps", "1.8"), ("save", "1.5"), ("every", "1000")):
        panel.locator(f"input[name={name}]").fill(value)
    assert "save every 333 steps" in panel.locator(".cadence-rule").inner_text()
    assert panel.locator(".cadence-worst").inner_text().startswith("1,000 steps · 30 min")
    assert "over the budget" in panel.locator(".cadence-worst").inner_text()
    assert panel.locator(".cadence-share").inner_text().startswith("0.1% of training time")
    panel.locator("input[name=sps]").fill("0")
    assert "secondsPerStep = 0" in panel.locator(".cadence-rule").inner_text()
    assert page.errors == []


def test_quick_from_its_link_resumes_bit_identical_and_the_calculator_measures_it(
    lab_server: Any, page: Any, vendor_built: None
) -> None:
    start_from_link(page, lab_server.url + "/lesson/quick?steps=900")
    assert page.locator(".run-A .knob-value").inner_text() == "ckpt_every 50"
    wait_step(page, "A", 20)
    assert re.search(r"/ 900", page.locator(".run-A .steps").inner_text())

    panel = page.locator("#cadence")
    panel.locator(".cadence-source").filter(has_text="measured on run A").wait_for(timeout=RUN_MS)
    assert panel.locator("input[name=every]").input_value() == "50"
    assert float(panel.locator("input[name=sps]").input_value()) > 0
    assert panel.locator(".cadence-worst").inner_text().startswith("50 steps")

    crash(page, "A", 70)
    check = wait_check(page, lab_server, "A", identical=True)
    assert "Bit-identical" in check.inner_text() and max_delta(check) == 0.0
    panel.locator(".cadence-source").filter(has_text="seconds per save from its ckpt").wait_for()
    stop_both(page)
    assert page.errors == []


def test_weights_only_checkpoints_resume_to_a_different_run(
    lab_server: Any, page: Any, vendor_built: None
) -> None:
    start_from_link(page, lab_server.url + "/lesson/lesson-1.8?steps=1500")
    assert "weights" in page.locator("#lesson-knob").inner_text()
    crash(page, "B", 130)
    crash(page, "A", 130)
    different = wait_check(page, lab_server, "B", identical=False)
    assert max_delta(different) > 0
    assert "Not bit-identical" in different.inner_text()
    same = wait_check(page, lab_server, "A", identical=True)
    assert max_delta(same) == 0.0
    stop_both(page)
    assert page.errors == []

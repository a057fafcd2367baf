"""Lessons end to end in a real Chromium, opened through their shareable links: `quick`
(a full checkpoint: the resume is bit-identical) and lesson 1.8 (run B saves the weights
only: its resume check must show Δ ≠ 0), plus the cadence calculator, its arithmetic
tested through page.evaluate and its panel filled from the running lesson."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.browser_lab import (
    RUN_MS,
    crash,
    resume_check,
    stop_both,
    wait_check,
    wait_step,
)
from tests.support.browser_lab import start as start_from_link

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]


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
    # The verdict's words come from what was measured: each metric that differed is named
    # as differing, each that matched (the learning rate: a function of the step) as matching.
    b_id = page.evaluate(
        """async () => {
            const pair = new URLSearchParams(location.search).get('pair');
            const view = await (await fetch(`/api/pairs/${pair}`)).json();
            return view.runs.find((r) => r.label === 'B').id;
        }"""
    )
    page.wait_for_function(
        "() => !/so far/.test(document.querySelector('#resume-checks li.run-B').innerText)",
        timeout=RUN_MS,
    )
    check = resume_check(page, b_id, 1)
    assert check is not None and check["complete"], check
    verdict = different.locator(".check-verdict").inner_text()
    cut = verdict.index(" differ")
    differ_part, match_part = verdict[:cut], verdict[cut:].split(". The checkpoint")[0]
    words = {"step.loss": "loss", "step.lr": "learning rate", "step.grad_norm": "grad norm"}
    compared = [x for x in check["fields"] if x["points"] > 0]
    for x in compared:
        if x["field"] in words:
            part = differ_part if x["equal"] is False else match_part
            assert words[x["field"]] in part, (x["field"], x["equal"], verdict)
    assert "schedule position started over" not in verdict and "those started over" not in verdict
    # "loss and N other metrics" opens to name every one of them.
    details = different.locator("details.check-fields")
    assert re.search(r"loss and \d+ other metrics", details.locator("summary").inner_text())
    details.locator("summary").click()
    named = details.locator("li").evaluate_all("(lis) => lis.map((li) => li.dataset.field)")
    assert sorted(named) == sorted(x["field"] for x in compared), named
    assert details.locator("li", has_text="learning rate").is_visible()
    same = wait_check(page, lab_server, "A", identical=True)
    assert max_delta(same) == 0.0
    stop_both(page)
    assert page.errors == []

"""What the browser tests do on the lab page: start a lesson, wait for a step, press Crash
test (skipping the lesson's prediction, until the kill costs steps to recompute), wait for
a resume check, stop the pair.

A kill that lands just after a checkpoint — in the evaluation, probe or sample that
follows it, which on a loaded machine can take longer than the steps between — costs 0
steps: the restart resumes at the last step trained and the check has nothing to compare
("Nothing to recompute"). That is a correct outcome, but not the one a test of the
comparison needs, so `crash` presses Crash test again, later, when it happens.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

RUN_MS = 180_000
CRASH_TRIES = 3


def wait_step(page: Any, label: str, at_least: int, timeout: int = RUN_MS) -> None:
    page.wait_for_function(
        """([label, n]) => {
            const e = document.querySelector(`.run-${label} .steps`);
            return e && parseInt(e.textContent.replace(/,/g, ''), 10) >= n;
        }""",
        arg=[label, at_least],
        timeout=timeout,
    )


def start(page: Any, url: str) -> None:
    """Open a lesson's page (or link) and press Start (skipping the prediction of a lesson
    that asks it before Start: one whose crash comes by itself)."""
    page.goto(url)
    page.locator("#start:not([disabled])").click()
    if page.locator("#predict[data-asking=start]").count():
        page.locator("#predict .predict-skip").click()
    page.wait_for_url(re.compile(r"\?pair="))
    page.locator(".run-card.run-B").wait_for()


def run_view(page: Any, label: str) -> dict[str, Any]:
    view: dict[str, Any] = page.evaluate(
        """async (label) => {
            const pair = new URLSearchParams(location.search).get('pair');
            const view = await (await fetch(`/api/pairs/${pair}`)).json();
            return view.runs.find((r) => r.label === label);
        }""",
        label,
    )
    return view


def resume_check(page: Any, run_id: str, segment: int) -> dict[str, Any] | None:
    checks: list[dict[str, Any]] = page.evaluate(
        "async (id) => (await (await fetch(`/api/runs/${id}/resume-checks`)).json()).checks",
        run_id,
    )
    return next((c for c in checks if c["segment"] == segment), None)


def press_crash(page: Any, label: str, after_step: int) -> None:
    wait_step(page, label, after_step)
    page.wait_for_function(
        "(l) => !document.querySelector(`.run-${l} .crash`).disabled", arg=label, timeout=RUN_MS
    )
    page.locator(f".run-{label} .crash").click()
    skip_prediction(page)
    page.locator(f".run-{label} .crash-why").filter(has_text="Killed process").wait_for()


def skip_prediction(page: Any) -> None:
    """A lesson that asks a prediction asks it at the first Crash test (or Preempt), and
    sends the crash once it is answered or skipped: tests of other things skip it."""
    if page.locator("#predict[data-asking=true]").count():
        page.locator("#predict .predict-skip").click()
        page.locator("#predict[data-asking=false]").wait_for()


def crash(page: Any, label: str, after_step: int, *, recompute: bool = True) -> None:
    """Crash test on run `label` once it is past `after_step`. `recompute`: the kill must
    cost steps (a resume check with something to compare); a kill that cost none is
    followed by another, 30 steps later. False for runs whose restart makes no check
    (one that refuses to start)."""
    for _ in range(CRASH_TRIES):
        before = run_view(page, label)
        press_crash(page, label, after_step)
        if not recompute:
            return
        segment = int(before["segment"] or 0) + 1
        deadline = time.monotonic() + RUN_MS / 1000
        while (check := resume_check(page, before["id"], segment)) is None:
            assert time.monotonic() < deadline, f"no resume check of {label}'s segment {segment}"
            time.sleep(0.3)
        if check["expected_points"] > 0:
            return
        after_step = int(run_view(page, label)["step"] or 0) + 30
    pytest.fail(f"{CRASH_TRIES} crash tests of {label} in a row cost no step to recompute")


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
        # The summary first: CI keeps a failure's opening lines and its tail, not its middle.
        pytest.fail(
            f"no {value} resume check for run {label} on the page; {check_summary(state)}\n"
            f"{e}\n{state}\n--- server log ---\n{lab_server.output()}"
        )
    return check


def check_summary(state: dict[str, Any]) -> str:
    """One line per run: its status, step and segment, and each resume check as the API
    serves it (segment, outcome, points of expected, bit_identical), then what the page
    showed: enough to tell a check that never completed from one the page did not show."""
    lines = []
    for run in state["view"]["runs"]:
        checks = state["checks"].get(run["label"], {}).get("checks", [])
        said = ", ".join(
            f"segment {c['segment']} {c.get('outcome')} {c['points']}/{c['expected_points']}"
            f" bit_identical={c['bit_identical']}"
            for c in checks
        )
        lines.append(
            f"run {run['label']}: {run.get('state')}/{run.get('stage')} step {run.get('step')} "
            f"segment {run.get('segment')} crashes {run.get('crashes')} "
            f"message {run.get('message')!r}; API checks: {said or 'none'}"
        )
    lines.append(f"page showed: {' | '.join(state['shown'].splitlines())[:600]}")
    return "\n".join(lines)

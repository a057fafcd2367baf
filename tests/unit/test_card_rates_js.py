"""The run card's tokens/s and MFU after a resume (web/static/metric_series.js
`recentRates`, over web/static/model.js's RunModel): only the restarted process's own work
counts — never the steps of an earlier segment (restored or recomputed steps), nor the
process's first record, written at start priority — over its recent steps, time-weighted.
Lesson 1.15's card showed "MFU 152.8 %" and "tokens/s 38k" (normal 5–10k) right after a
resume: one record's rate. Run in node on records shaped as the stream sends them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crashdrill.trainer.record_contract import contract_json

STATIC = Path(__file__).resolve().parents[2] / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's modules")

TOKENS = 512  # tokens a step (batch 8 × ctx 64)


def step(segment: int, n: int, tps: float, mfu: float, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "step",
        "segment": segment,
        "step": n,
        "loss": 1.0,
        "t": segment * 1000 + n,
        "tokens_per_s": tps,
        "mfu": mfu,
        "dt": TOKENS / tps,
        **extra,
    }


def rates(records: list[dict[str, Any]]) -> Any:
    model, series = (json.dumps((STATIC / m).as_uri()) for m in ("model.js", "metric_series.js"))
    keyed = [k["name"] for k in contract_json()["kinds"] if k.get("keyed_by_step")]
    code = f"""
        Promise.all([import({model}), import({series})]).then(([m, s]) => {{
            const run = new m.RunModel({{id: "r", label: "B", state: "running", stage: "train",
                segment: 1, crashes: 1, step: 110}}, new Set({json.dumps(keyed)}));
            run.add({json.dumps(records)});
            console.log(JSON.stringify(s.recentRates(run)));
        }})"""
    assert NODE is not None
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_after_a_resume_the_rates_are_the_restarted_process_s_own_steps() -> None:
    before = [
        step(0, n, 8000.0, 0.08, **({"startup_s": 0.4} if n == 1 else {})) for n in range(1, 175)
    ]
    # The restart: its first step ran at start priority while the lab's other trainers
    # yielded (38k tokens/s, MFU 1.53 against a peak measured under load) …
    first = step(1, 101, 38000.0, 1.528, startup_s=1.3)
    # … and then it trains like the others, at 5–6k.
    after = [
        step(1, n, 5000.0 if n % 2 else 6000.0, 0.05 if n % 2 else 0.06) for n in range(102, 112)
    ]
    got = rates([*before, first])
    # Only its first record so far, at start priority: no rate is shown until it trains.
    assert got == {"tokensPerS": None, "mfu": None, "steps": 0}
    got = rates([*before, first, *after])
    assert got["steps"] == 10
    # Time-weighted over its own ten steps: 10 steps × 512 tokens over their own seconds.
    seconds = sum(TOKENS / r["tokens_per_s"] for r in after)
    assert got["tokensPerS"] == pytest.approx(10 * TOKENS / seconds)
    assert 5000 < got["tokensPerS"] < 6000 and got["mfu"] < 0.07


def test_a_run_with_no_step_record_yet_shows_no_rate() -> None:
    assert rates([]) == {"tokensPerS": None, "mfu": None, "steps": 0}

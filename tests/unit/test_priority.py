"""A trainer's priority in the lab (trainer/priority.py): every thread drops to the lab's
nice value once the trainer trains; nothing is ever raised; no variable, no change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from crashdrill.trainer.priority import NICE_VARIABLE, settle_after_first_step, wanted_nice

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads")

# In a child process (a nice value cannot be taken back): a thread started before the call
# and one after it both end at the asked value; a second call asking for less changes
# nothing.
CHILD = """
import json, os, sys, threading
from crashdrill.trainer.priority import settle_after_first_step
before, gate = threading.Event(), threading.Event()
seen = {}
def worker(name):
    before.set() if name == "early" else None
    gate.wait()
    seen[name] = os.getpriority(os.PRIO_PROCESS, 0)
early = threading.Thread(target=worker, args=("early",)); early.start(); before.wait()
got = settle_after_first_step({"CRASHDRILL_TRAINER_NICE": sys.argv[1]})
late = threading.Thread(target=worker, args=("late",)); late.start()
gate.set(); early.join(); late.join()
again = settle_after_first_step({"CRASHDRILL_TRAINER_NICE": "3"})
print(json.dumps({"got": got, "main": os.getpriority(os.PRIO_PROCESS, 0), **seen,
                  "after_lower_ask": os.getpriority(os.PRIO_PROCESS, 0)}))
"""


def test_every_thread_drops_to_the_asked_value_and_never_climbs_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "7"], capture_output=True, text=True, check=True
    ).stdout
    import json

    seen = json.loads(out)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    want = max(7, base)
    assert seen == {
        "got": 7,
        "main": want,
        "early": want,
        "late": want,
        "after_lower_ask": want,
    }


@pytest.mark.parametrize("raw", ["", "  ", "ten", "-1", "20", "1.5"])
def test_no_value_or_a_bad_one_changes_nothing(raw: str) -> None:
    assert wanted_nice({NICE_VARIABLE: raw}) is None
    assert settle_after_first_step({NICE_VARIABLE: raw}) is None


def test_no_variable_changes_nothing() -> None:
    before = os.getpriority(os.PRIO_PROCESS, 0)
    assert settle_after_first_step({}) is None
    assert os.getpriority(os.PRIO_PROCESS, 0) == before

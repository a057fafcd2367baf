"""SIGINT/SIGTERM during a drill (drill/interrupt.py): the first raises DrillInterrupted,
one during the cleanup after it is ignored, and the handlers are put back afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest

from crashdrill.drill.interrupt import DrillInterrupted, exit_code, stop_on_signals


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_first_signal_stops_the_drill_and_a_second_one_lets_the_cleanup_finish(
    sig: signal.Signals, code: int
) -> None:
    before = signal.getsignal(sig)
    cleaned = False
    with pytest.raises(DrillInterrupted) as info, stop_on_signals():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # interrupted at once
        finally:
            os.kill(os.getpid(), sig)  # a second Ctrl-C while the drill cleans up
            time.sleep(0.05)
            cleaned = True
    assert cleaned and info.value.name == sig.name and exit_code(info.value.signum) == code
    assert signal.getsignal(sig) == before


def test_an_ignored_signal_is_caught_during_the_drill_all_the_same() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup, a background job
    try:
        with pytest.raises(DrillInterrupted), stop_on_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)

"""Open event streams per address and in all (server/stream/slots.py)."""

from __future__ import annotations

import gc

import pytest

from crashdrill.server.errors import TooMany
from crashdrill.server.stream.slots import StreamSlots


def test_slots_are_capped_per_address_and_in_all_and_given_back_once() -> None:
    slots = StreamSlots(per_address=2, total=3)
    a1, a2 = slots.take("a"), slots.take("a")
    with pytest.raises(TooMany, match="STREAM_MAX_PER_ADDRESS"):
        slots.take("a")
    b1 = slots.take("b")
    with pytest.raises(TooMany, match="STREAM_MAX_TOTAL"):
        slots.take("c")
    a1.release()
    a1.release()  # twice is once
    assert slots.open_count() == 2 and slots.open_count("a") == 1
    del a2
    gc.collect()  # a slot nobody released (a stream that never started) is given back too
    assert slots.open_count("a") == 0
    b1.release()
    assert slots.open_count() == 0

"""A bound on open event streams: per client address and in all (429 past either).

    slot = slots.take(address)   # TooMany naming the limit and the setting when full
    ...
    slot.release()               # idempotent; also run when the slot is garbage

Each browser tab holds one stream, so a class behind one NAT shares one address: the
per-address limit (`stream_max_per_address`) is generous, the total (`stream_max_total`)
protects the server's file descriptors and memory.
"""

from __future__ import annotations

import threading
import weakref

from crashdrill.server.errors import TooMany

RETRY_AFTER_S = 10


class StreamSlot:
    def __init__(self, slots: StreamSlots, address: str) -> None:
        self._release = weakref.finalize(self, slots._give_back, address)

    def release(self) -> None:
        self._release()  # a finalizer runs at most once


class StreamSlots:
    """Open streams per address and in all. Thread-safe."""

    def __init__(self, per_address: int, total: int) -> None:
        self.per_address = per_address
        self.total = total
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._count = 0

    def take(self, address: str) -> StreamSlot:
        with self._lock:
            if self._count >= self.total:
                raise TooMany(
                    f"the lab already serves {self._count} live streams, its limit"
                    " (CRASHDRILL_STREAM_MAX_TOTAL): close a tab or try again shortly",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            mine = self._open.get(address, 0)
            if mine >= self.per_address:
                raise TooMany(
                    f"this address already has {mine} live streams open, the limit"
                    " (CRASHDRILL_STREAM_MAX_PER_ADDRESS): close some tabs",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self._open[address] = mine + 1
            self._count += 1
        return StreamSlot(self, address)

    def open_count(self, address: str | None = None) -> int:
        with self._lock:
            return self._count if address is None else self._open.get(address, 0)

    def _give_back(self, address: str) -> None:
        with self._lock:
            left = self._open.get(address, 0) - 1
            if left > 0:
                self._open[address] = left
            else:
                self._open.pop(address, None)
            self._count -= 1

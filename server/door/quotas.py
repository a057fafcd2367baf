"""Quotas that hold: how many pairs one client may have queued or training, how long the
lab's queue may grow, and the free space a new pair needs.

    check_new_pair(settings, store, owner=session, client="203.0.113.7",
                   instructor=False, disk_free=keeper.disk_free,
                   disk_bytes=pair_disk_bytes(preset, limits))    # or TooMany / Unavailable

One client. A student's browser (its session cookie) may have `max_pairs_per_session`
pairs queued or training, and so may its address (`max_pairs_per_address`): dropping the
cookie makes a new browser, not a new address. A class behind one NAT shares an address;
there, set `max_pairs_per_address` to the class's share (or 0: by cookie alone, trusting
the students' cookies). Past either limit: 429 naming it. What an address's live pairs
will write to disk together (each pair's estimate, server/lessons/bounds.py: checkpoints ×
their size, mirror copies counted) is bounded by `max_disk_bytes_per_address`: past it,
429 with the numbers. Instructors are exempt.

The lab. At most `max_queued_runs` runs wait in the queue; past it a new pair gets 503
with Retry-After (the lab is busy, not the client at fault). With less than
`min_free_disk_bytes` free where the runs live, a new pair gets 503 saying so (the
housekeeping pass deletes old checkpoints; server/housekeeping.py). These hold for
instructors too.
"""

from __future__ import annotations

from collections.abc import Callable

from crashdrill.server.errors import TooMany, Unavailable
from crashdrill.server.settings import Settings
from crashdrill.server.storage.store import RunState, Store
from crashdrill.trainer.presets import LABELS

QUEUE_RETRY_AFTER_S = 60
DISK_RETRY_AFTER_S = 300


def size_text(n: float) -> str:
    """Bytes for people: 1.5 GiB, 300 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


def check_new_pair(
    settings: Settings,
    store: Store,
    *,
    owner: str,
    client: str | None,
    instructor: bool,
    disk_free: Callable[[], int],
    disk_bytes: int = 0,
) -> None:
    """Raise TooMany (429) or Unavailable (503) when a new pair may not be created now
    (`disk_bytes`: what the new pair's runs will write)."""
    if not instructor:
        mine = store.active_pairs_of(owner)
        if mine >= settings.max_pairs_per_session:
            raise TooMany(
                f"this browser already has {mine} pairs queued or training (the limit is"
                f" {settings.max_pairs_per_session}): stop one or let it finish"
            )
        limit = settings.max_pairs_per_address
        if limit and client:
            ours = store.active_pairs_from(client)
            if ours >= limit:
                raise TooMany(
                    f"your address already has {ours} pairs queued or training (the limit is"
                    f" {limit} per address, max_pairs_per_address): stop one or let it finish;"
                    " a class behind one address needs the instructor to raise the limit"
                )
        budget = settings.max_disk_bytes_per_address
        if budget and client:
            live = store.disk_bytes_from(client)
            if live + disk_bytes > budget:
                raise TooMany(
                    f"this pair would write about {size_text(disk_bytes)} of checkpoints"
                    f" ({disk_bytes:,} bytes) and your address's live pairs"
                    f" {size_text(live)} ({live:,}); the limit is {size_text(budget)}"
                    f" ({budget:,} bytes, max_disk_bytes_per_address): save fewer"
                    " checkpoints (raise ckpt_every or lower steps), or stop a pair"
                )
    queued = len(store.runs_in([RunState.QUEUED]))
    if queued + len(LABELS) > settings.max_queued_runs:
        raise Unavailable(
            f"the lab's queue is full ({queued} runs waiting; the limit is"
            f" {settings.max_queued_runs}, max_queued_runs): try again in a few minutes,"
            " when some runs have finished",
            headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)},
        )
    floor = settings.min_free_disk_bytes
    if floor:
        free = disk_free()
        if free < floor:
            raise Unavailable(
                f"the lab's disk is nearly full ({size_text(free)} free; new pairs need"
                f" {size_text(floor)}, min_free_disk_bytes): try again later, once old"
                " checkpoints are cleaned up, or ask the instructor",
                headers={"Retry-After": str(DISK_RETRY_AFTER_S)},
            )

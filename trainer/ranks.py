"""A group of data-parallel ranks on one machine, forked from the process that runs the
trainer, joined through torch's env:// contract and a TCPStore rendezvous of their own.

    code = run_group(world=2, body=lambda group: train_rank(group))   # in the trainer

The trainer process becomes the group's launcher, as torchrun's agent is: it forks every
rank (each already has torch and crashdrill imported: no `import torch` per rank), watches
them, and exits with the group's status. Each rank gets torch's launcher environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so everything
below it (init_process_group, DDP, DCP) sees what torchrun would give it.

- The rendezvous is per run: rank 0 opens the TCPStore on port 0 (the kernel picks a free
  port) and tells the launcher which one, and only then are the other ranks forked with
  it. Thirty runs started at once never race for one port.
- Collectives time out after COLLECTIVE_TIMEOUT_S: a rank whose peer vanished without
  the launcher noticing fails within that, instead of hanging for torch's 10 minutes.
- The launcher watches: when one rank ends with a failure, it SIGKILLs the others and
  exits with that rank's status; a SIGTERM/SIGINT to the launcher takes the whole group.
  A kill of the run (the launcher's process tree) takes every rank with it.
- The launcher forks before any tensor work and holds no thread: a fork is as safe here
  as the fork server's (crashdrill/processes/forkserver.py).
- It writes the run dir's ranks file (run_files.RANKS_FILE) once every rank is forked:
  its own pid, each rank's, and the rank a `[crash] mode = "rank"` test kills
  (`crash_rank`, or one chosen by the seed); when it loses a rank it adds which one, its
  status and when it noticed (`lost`). The supervisor's rank crash reads it.
- With CRASHDRILL_RANK_PHASES=1 in its environment the launcher and every rank print one
  stderr line per phase of the group's start (`phase_line`; benchmarks/ranks.py reads
  them with `parse_phases`): where a restart's seconds go.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

# How long a collective waits for a missing peer before it fails (seconds). Short: a lost
# rank should end the group within a lesson's attention span, not torch's default 30 min.
COLLECTIVE_TIMEOUT_S = 60.0
MASTER_ADDR = "127.0.0.1"
# Torch's launcher contract: the names torchrun sets in each rank's environment.
ENV_RANK, ENV_WORLD, ENV_LOCAL_RANK, ENV_LOCAL_WORLD = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)
ENV_ADDR, ENV_PORT = "MASTER_ADDR", "MASTER_PORT"
# Set to 1 in a trainer's environment: its launcher and ranks print their start's phases.
PHASES_ENV = "CRASHDRILL_RANK_PHASES"
LAUNCHER = -1  # the launcher's "rank" in a phase line
_PHASE = re.compile(r"^crashdrill: phase (-?\d+) (\w+) at ([\d.]+)$", re.MULTILINE)


def phase(rank: int, name: str) -> None:
    """Say on stderr that `rank` (LAUNCHER: the launcher) reached `name`, when asked to."""
    if os.environ.get(PHASES_ENV) == "1":
        print(phase_line(rank, name, time.time()), file=sys.stderr, flush=True)


def phase_line(rank: int, name: str, at: float) -> str:
    return f"crashdrill: phase {rank} {name} at {at:.6f}"


def parse_phases(text: str) -> list[tuple[int, str, float]]:
    """Every phase line in `text`: (rank, name, wall-clock time), in the order printed."""
    return [(int(r), n, float(t)) for r, n, t in _PHASE.findall(text)]


def crash_rank_of(crash_rank: int, seed: int, world: int) -> int:
    """The rank a `[crash] mode = "rank"` test kills: `crash_rank` where it is set (≥ 0),
    else one chosen by the seed."""
    return crash_rank if crash_rank >= 0 else seed % world


def read_ranks_file(path: Path) -> dict[str, Any] | None:
    """The ranks file a launcher wrote (None: none, or not readable as one)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pids"), dict) else None


def _write_ranks_file(path: Path | None, data: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


@dataclass(frozen=True)
class RankGroup:
    """Where this process stands in its group."""

    rank: int
    world: int

    @property
    def leader(self) -> bool:
        """Rank 0 writes the group's records and manifests."""
        return self.rank == 0


def join_group(group: RankGroup, store: object, device_type: str) -> None:
    """init_process_group over `store`: NCCL where each rank has its own GPU, gloo else."""
    import torch.distributed as dist

    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=store,  # type: ignore[arg-type]
        rank=group.rank,
        world_size=group.world,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )


def open_store(group: RankGroup) -> object:
    """Rank 0 opens the group's TCPStore on a free port; the others join it at the port
    their environment names."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if group.leader:
        return TCPStore(MASTER_ADDR, 0, group.world, True, timeout, wait_for_workers=False)
    port = int(os.environ[ENV_PORT])
    return TCPStore(os.environ[ENV_ADDR], port, group.world, False, timeout)


def _rank_env(rank: int, world: int, port: int | None) -> None:
    os.environ.update(
        {
            ENV_RANK: str(rank),
            ENV_WORLD: str(world),
            ENV_LOCAL_RANK: str(rank),
            ENV_LOCAL_WORLD: str(world),
            ENV_ADDR: MASTER_ADDR,
        }
    )
    if port is not None:
        os.environ[ENV_PORT] = str(port)


def _fork_rank(rank: int, world: int, port_w: int | None, body: Callable[[RankGroup], int]) -> int:
    """Fork rank `rank`; the child runs `body` and exits with its code (never returns)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        phase(rank, "started")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        group = RankGroup(rank, world)
        if port_w is not None:  # rank 0: open the store, then say its port
            store = open_store(group)
            os.write(port_w, f"{store.port}\n".encode())  # type: ignore[attr-defined]
            os.close(port_w)
            os.environ[ENV_PORT] = str(store.port)  # type: ignore[attr-defined]
            _STORES[0] = store
        code = body(group)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# Rank 0's store, kept alive for the body (a store that is collected closes the rendezvous).
_STORES: dict[int, object] = {}


def rank_store(group: RankGroup) -> object:
    """The group's store as this rank holds it: rank 0's own server, a client elsewhere."""
    return _STORES[0] if group.leader else open_store(group)


def _read_port(fd: int) -> int:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            raise RuntimeError("rank 0 ended before it opened the group's rendezvous")
        data += chunk
    os.close(fd)
    return int(data)


def _status(wait_status: int) -> int:
    """An exit status as a shell reports it: the code, or 128 + the signal."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def run_group(
    world: int,
    body: Callable[[RankGroup], int],
    *,
    ranks_file: Path | None = None,
    crash_rank: int = 0,
) -> int:
    """Fork `world` ranks running `body`, watch them, return the group's exit status:
    rank 0's when every rank succeeded, else the first failed rank's. `ranks_file`: where
    to say the group's pids (and `crash_rank`, the rank a rank crash kills)."""
    phase(LAUNCHER, "group")
    read_fd, write_fd = os.pipe()
    pids: dict[int, int] = {}
    _rank_env(0, world, None)
    pids[_fork_rank(0, world, write_fd, body)] = 0
    os.close(write_fd)
    try:
        port = _read_port(read_fd)
        phase(LAUNCHER, "store_open")
        for rank in range(1, world):
            _rank_env(rank, world, port)
            pids[_fork_rank(rank, world, None, body)] = rank
    except BaseException:
        _kill_all(pids)
        raise
    phase(LAUNCHER, "forked")
    said = {"launcher": os.getpid(), "world": world, "crash_rank": crash_rank,
            "pids": {str(r): pid for pid, r in pids.items()}}  # fmt: skip
    _write_ranks_file(ranks_file, said)
    return _watch(pids, lambda lost: _write_ranks_file(ranks_file, {**said, "lost": lost}))


def _kill_all(pids: dict[int, int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _watch(pids: dict[int, int], on_lost: Callable[[dict[str, Any]], None]) -> int:
    """Reap the ranks; on the first that fails, SIGKILL the rest (no peer is left hanging
    in a collective) and say which was lost (`on_lost`); a SIGTERM/SIGINT here does the
    same without the saying."""

    def stop_group(signum: int, _frame: object) -> None:
        _kill_all(pids)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop_group)
    signal.signal(signal.SIGINT, stop_group)
    live, codes = dict(pids), {}
    failed: int | None = None
    while live:
        pid, wait_status = os.wait()
        rank = live.pop(pid, None)
        if rank is None:
            continue
        codes[rank] = _status(wait_status)
        if codes[rank] != 0 and failed is None:
            noticed = time.time()
            failed = codes[rank]
            _kill_all(live)
            on_lost({"rank": rank, "status": failed, "noticed_at": round(noticed, 6)})
            print(
                f"crashdrill: rank {rank} ended with status {failed}; stopping the group",
                file=sys.stderr,
                flush=True,
            )
    return codes[0] if failed is None else failed

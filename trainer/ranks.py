"""A group of data-parallel ranks on one machine, forked from the process that runs the
trainer, joined through torch's env:// contract and a TCPStore rendezvous of their own.

    code = run_group(world=2, body=lambda group: train_rank(group))   # in the trainer

The trainer process becomes the group's launcher, as torchrun's agent is: it forks every
rank (each already has torch and crashdrill imported: no `import torch` per rank), watches
them, and exits with the group's status. Each rank gets torch's launcher environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so everything
below it (init_process_group, DDP, DCP) sees what torchrun would give it.

- The rendezvous is per run: rank 0 opens the TCPStore on port 0 (the kernel picks a free
  port) and writes which one into a pipe the launcher forked every rank with, once for
  each other rank; they read it when they join, after building and loading what needs
  no peer (trainer/rank_loop.py). Thirty runs started at once never race for one port.
- Collectives time out after COLLECTIVE_TIMEOUT_S: a rank whose peer vanished without
  the launcher noticing fails within that, instead of hanging for torch's 10 minutes.
- The launcher watches (`launcher = "watch"`): when one rank ends with a failure, it
  SIGKILLs the others and exits with that rank's status; a SIGTERM/SIGINT to the launcher
  takes the whole group. A kill of the run (the launcher's process tree) takes every rank
  with it. The teaching mode `launcher = "blind"` does not take the group down: the
  survivors wait in their next collective until its timeout (the run's
  `collective_timeout_s`), fail, and only then does the group end. So that they do wait
  (gloo on one machine sees a killed peer's sockets close at once, where a silent host or
  NCCL leaves its peers waiting), each rank of a blind group forks a keeper that holds its
  connections open until the launcher is gone (`keep_connections`).
- The launcher forks before any tensor work and holds no thread: a fork is as safe here
  as the fork server's (crashdrill/processes/forkserver.py).
- It writes the run dir's ranks file (run_files.RANKS_FILE) once every rank is forked:
  its own pid, each rank's, the machine's hostname (whose pids they are), and the rank a
  `[crash] mode = "rank"` test kills
  (`crash_rank`, or one chosen by the seed); when it loses a rank it adds which one, its
  status and when it noticed (`lost`). The supervisor's rank crash reads it.
- Across nodes (a run spread over a cluster's nodes, workers/ray_executor.py), every node
  runs a launcher of its own for its ranks, as torchrun's agent runs one per node, told
  where it stands by torchrun's own environment (PET_NNODES, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT: `NodeSpec.from_env`): node K forks global ranks
  K·L … K·L+L−1 (L = world / nodes), rank 0 opens the store at the master's port and every
  other rank joins it there. Each launcher watches its own ranks; a rank lost on another
  node ends the group through its peers' failed collective (gloo sees the closed
  connection), and the executor, which watches every node's launcher, ends the rest.
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
import socket
import sys
import time
import warnings
from collections.abc import Callable, Mapping
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
ENV_GROUP_RANK = "GROUP_RANK"  # torchrun's name for the node's rank, in each rank's env
# torchrun's agent options as its environment carries them (torch.distributed.run reads
# every option from PET_<NAME>): what a node's launcher of a spread group is told.
PET_NNODES, PET_NODE_RANK = "PET_NNODES", "PET_NODE_RANK"
PET_MASTER_ADDR, PET_MASTER_PORT = "PET_MASTER_ADDR", "PET_MASTER_PORT"
# Set to 1 in a trainer's environment: its launcher and ranks print their start's phases.
PHASES_ENV = "CRASHDRILL_RANK_PHASES"
LAUNCHER = -1  # the launcher's "rank" in a phase line
# The blind launcher's events (trainer/event_codes.py): a rank lost while the others wait,
# and the survivor's collective timeout that ends the group.
LOST_WAITING_CODE = "rank_lost_waiting"
TIMED_OUT_CODE = "collective_timed_out"
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
class NodeSpec:
    """Where one node's launcher stands in a group spread over `nodes` nodes."""

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str], world: int) -> NodeSpec | None:
        """The node's place from torchrun's PET_* names (None: one machine, no PET_NNODES
        or 1); ValueError naming the variable and what is allowed."""
        raw = env.get(PET_NNODES)
        if raw in (None, "", "1"):
            return None

        def whole(name: str, low: int, high: int) -> int:
            try:
                value = int(env.get(name, ""))
            except ValueError:
                value = -1
            if not low <= value <= high:
                raise ValueError(
                    f"{name} = {env.get(name)!r}: a whole number in [{low}, {high}]"
                    f" for a group of {world} ranks"
                )
            return value

        nodes = whole(PET_NNODES, 1, world)
        if world % nodes:
            raise ValueError(f"{PET_NNODES} = {nodes}: it must divide ranks = {world}")
        node_rank = whole(PET_NODE_RANK, 0, nodes - 1)
        addr = env.get(PET_MASTER_ADDR, "")
        if not addr:
            raise ValueError(f"{PET_MASTER_ADDR} is not set: the address of node 0")
        return cls(nodes, node_rank, addr, whole(PET_MASTER_PORT, 1, 65535))

    def local_ranks(self, world: int) -> range:
        """The global ranks this node's launcher starts."""
        per = world // self.nodes
        return range(self.node_rank * per, (self.node_rank + 1) * per)


@dataclass(frozen=True)
class RankGroup:
    """Where this process stands in its group (`nodes` > 1: spread over several nodes,
    `local_rank` its place on its own)."""

    rank: int
    world: int
    local_rank: int | None = None
    nodes: int = 1

    @property
    def leader(self) -> bool:
        """Rank 0 writes the group's records and manifests."""
        return self.rank == 0

    @property
    def node_leader(self) -> bool:
        """The lowest rank on its node: it does the node's file-system part of a save."""
        return (self.rank if self.local_rank is None else self.local_rank) == 0

    @property
    def spread(self) -> bool:
        """Its ranks live on several nodes, each with a disk of its own."""
        return self.nodes > 1


def join_group(
    group: RankGroup, store: object, device_type: str, timeout_s: float = COLLECTIVE_TIMEOUT_S
) -> None:
    """init_process_group over `store`: NCCL where each rank has its own GPU, gloo else;
    a collective waits `timeout_s` for a missing peer (the run's collective_timeout_s)."""
    import torch.distributed as dist

    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=store,  # type: ignore[arg-type]
        rank=group.rank,
        world_size=group.world,
        timeout=timedelta(seconds=timeout_s),
    )


def keep_connections() -> None:
    """Blind launcher: fork a keeper that holds this rank's sockets open after the rank
    dies, as a host that went silent does, so that its peers wait in their collective until
    it times out instead of reading "Connection closed by peer" at once. The keeper does
    nothing else and ends once the launcher (this rank's parent) has ended."""
    launcher = os.getppid()
    with warnings.catch_warnings():  # it runs no Python that could need another thread
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the run's pipes open: only the sockets
            os.dup2(null, fd)
        while _alive(launcher):
            time.sleep(0.1)
    finally:
        os._exit(0)


def _alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def open_store(group: RankGroup) -> object:
    """Rank 0 opens the group's TCPStore on a free port; the others join it at the port
    their environment names."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if group.leader:  # at the master's port across nodes; any free one on one machine
        port = int(os.environ[ENV_PORT]) if group.spread else 0
        return TCPStore(os.environ.get(ENV_ADDR, MASTER_ADDR), port, group.world, True,
                        timeout, wait_for_workers=False)  # fmt: skip
    port = int(os.environ[ENV_PORT])
    return TCPStore(os.environ[ENV_ADDR], port, group.world, False, timeout)


def _rank_env(rank: int, world: int, node: NodeSpec | None = None) -> None:
    local = rank if node is None else rank - node.local_ranks(world).start
    os.environ.update(
        {
            ENV_RANK: str(rank),
            ENV_WORLD: str(world),
            ENV_LOCAL_RANK: str(local),
            ENV_LOCAL_WORLD: str(world if node is None else world // node.nodes),
            ENV_ADDR: MASTER_ADDR if node is None else node.master_addr,
            ENV_GROUP_RANK: str(0 if node is None else node.node_rank),
        }
    )
    if node is not None:  # the master's, known before any rank starts
        os.environ[ENV_PORT] = str(node.master_port)
    else:  # rank 0's, from the pipe (rank_store); never inherited
        os.environ.pop(ENV_PORT, None)


def _fork_rank(
    group: RankGroup, port_pipe: tuple[int, int], body: Callable[[RankGroup], int]
) -> int:
    """Fork rank `group.rank`; the child runs `body` and exits with its code (never
    returns). `port_pipe`: on one machine rank 0 writes the store's port into it for each
    other rank, which keep its read end to read it when they join (rank_store); a spread
    group's ranks know the master's port from their environment."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    rank, world = group.rank, group.world
    try:
        phase(rank, "started")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        read_fd, write_fd = port_pipe
        if group.spread:
            os.close(read_fd)
            os.close(write_fd)
            if group.leader:
                _STORES[0] = open_store(group)
        elif group.leader:  # open the store, then say its port, once for each other rank
            os.close(read_fd)
            store = open_store(group)
            port = store.port  # type: ignore[attr-defined]
            os.write(write_fd, _port_record(port) * (world - 1))  # one write: atomic
            os.close(write_fd)
            os.environ[ENV_PORT] = str(port)
            _STORES[0] = store
        else:
            os.close(write_fd)  # rank 0 ending before it wrote reads as the pipe's end
            _PORT_FD[0] = read_fd
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
# Another rank's read end of the pipe its launcher forked it with: rank 0's port comes there.
_PORT_FD: dict[int, int] = {}
_PORT_BYTES = 6  # "NNNNN\n": a port, fixed width, so that every rank reads exactly its own


def _port_record(port: int) -> bytes:
    return f"{port:05d}\n".encode()


def rank_store(group: RankGroup) -> object:
    """The group's store as this rank holds it: rank 0's own server, a client elsewhere
    (at the port rank 0 wrote into the launcher's pipe, read once)."""
    if group.leader:
        return _STORES[0]
    if ENV_PORT not in os.environ:
        os.environ[ENV_PORT] = str(_read_port(_PORT_FD.pop(0)))
    return open_store(group)


def _read_port(fd: int) -> int:
    """One port record from rank 0 (its one write put them all in the pipe at once, and a
    pipe's reads are serialized, so each rank reads a whole record of its own)."""
    data = b""
    while len(data) < _PORT_BYTES:
        chunk = os.read(fd, _PORT_BYTES - len(data))
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
    blind: bool = False,
    timeout_s: float = COLLECTIVE_TIMEOUT_S,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    node: NodeSpec | None = None,
) -> int:
    """Fork `world` ranks running `body`, watch them, return the group's exit status:
    rank 0's when every rank succeeded, else the first failed rank's. `ranks_file`: where
    to say the group's pids (and `crash_rank`, the rank a rank crash kills). `blind`: the
    teaching mode that leaves the survivors of a lost rank to their collective's timeout
    (`timeout_s`); `on_event(code, fields)` is told of the loss (LOST_WAITING_CODE) and
    of the timeout that ended the group (TIMED_OUT_CODE). `node`: this launcher is one
    node's of a group spread over several; it forks and watches this node's ranks only
    (its status: its ranks', rank 0's where it has it)."""
    phase(LAUNCHER, "group")
    # Every rank forked at once: rank 0 opens the store and writes its port once for each
    # other rank into this pipe, which they read when they join (after building and
    # loading what needs no peer), instead of the launcher waiting for the port to fork
    # them.
    read_fd, write_fd = os.pipe()
    pids: dict[int, int] = {}
    here = range(world) if node is None else node.local_ranks(world)
    try:
        for rank in here:
            _rank_env(rank, world, node)
            group = (
                RankGroup(rank, world)
                if node is None
                else RankGroup(rank, world, rank - here.start, node.nodes)
            )
            pid = _fork_rank(group, (read_fd, write_fd), body)
            pids[pid] = rank
    except BaseException:
        _kill_all(pids)
        raise
    finally:
        os.close(read_fd)
        os.close(write_fd)
    phase(LAUNCHER, "forked")
    said = {
        "launcher": os.getpid(),
        "world": world,
        "crash_rank": crash_rank,
        "pids": {str(r): pid for pid, r in pids.items()},
        "hostname": socket.gethostname(),
        **({"node_rank": node.node_rank, "nodes": node.nodes} if node is not None else {}),
    }  # fmt: skip  (whose pids: a cluster node's)
    _write_ranks_file(ranks_file, said)

    def on_lost(lost: dict[str, Any]) -> None:
        _write_ranks_file(ranks_file, {**said, "lost": lost})

    if blind:
        return _watch_blind(pids, on_lost, timeout_s, on_event or (lambda code, fields: None))
    return _watch(pids, on_lost)


def _kill_all(pids: dict[int, int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _group_dies_with_launcher(pids: dict[int, int]) -> None:
    """A SIGTERM/SIGINT to the launcher SIGKILLs every rank, then ends the launcher."""

    def stop_group(signum: int, _frame: object) -> None:
        _kill_all(pids)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop_group)
    signal.signal(signal.SIGINT, stop_group)


def _watch(pids: dict[int, int], on_lost: Callable[[dict[str, Any]], None]) -> int:
    """Reap the ranks; on the first that fails, SIGKILL the rest (no peer is left hanging
    in a collective) and say which was lost (`on_lost`); a SIGTERM/SIGINT here does the
    same without the saying."""

    _group_dies_with_launcher(pids)
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
    return codes[min(codes)] if failed is None else failed  # rank 0, or the node's lowest


def _watch_blind(
    pids: dict[int, int],
    on_lost: Callable[[dict[str, Any]], None],
    timeout_s: float,
    on_event: Callable[[str, dict[str, Any]], None],
) -> int:
    """The blind launcher: reap the ranks; on the first that fails, say so and when the
    survivors' collective will time out, and leave them to it; once one of them fails
    (the timeout), the group ends. A survivor still alive well past that is SIGKILLed."""

    _group_dies_with_launcher(pids)
    live, codes = dict(pids), {}
    lost: dict[str, Any] | None = None
    while live:
        pid, wait_status = os.waitpid(-1, os.WNOHANG) if lost else os.wait()
        if pid == 0:  # nothing ended yet: the survivors are still waiting
            if time.time() > lost["deadline"] + max(30.0, timeout_s):  # type: ignore[index]
                _kill_all(live)  # a survivor that never timed out: not left behind
            time.sleep(0.05)
            continue
        rank = live.pop(pid, None)
        if rank is None:
            continue
        codes[rank] = _status(wait_status)
        if codes[rank] == 0:
            continue
        now = time.time()
        if lost is None:
            deadline = now + timeout_s
            lost = {"rank": rank, "status": codes[rank], "noticed_at": round(now, 6),
                    "deadline": round(deadline, 3), "launcher": "blind"}  # fmt: skip
            on_lost(lost)
            on_event(LOST_WAITING_CODE, {"lost_rank": rank, "status": codes[rank],
                     "timeout_s": float(timeout_s), "deadline": round(deadline, 3)})  # fmt: skip
            print(
                f"crashdrill: rank {rank} ended with status {codes[rank]}; the blind launcher"
                f" leaves the others waiting in their collective for up to {timeout_s:g} s",
                file=sys.stderr,
                flush=True,
            )
        elif "timed_out" not in lost:
            lost["timed_out"] = {"rank": rank, "at": round(now, 6)}
            on_lost(lost)
            on_event(TIMED_OUT_CODE, {"rank": rank, "lost_rank": lost["rank"],
                     "waited_s": round(now - lost["noticed_at"], 3)})  # fmt: skip
            print(
                f"crashdrill: rank {rank} ended with status {codes[rank]} after waiting"
                f" {now - lost['noticed_at']:.1f} s for rank {lost['rank']}; the group ends",
                file=sys.stderr,
                flush=True,
            )
    return codes[min(codes)] if lost is None else int(lost["status"])

"""The Ray executor: each run's trainer on a node of a Ray cluster
(`crashdrill serve --executor ray --ray-address ADDRESS`, or `--ray ADDRESS`).

    executor = RayExecutor.connect("127.0.0.1:6379", mirror="/shared/mirror")
    Supervisor(launch, on_change, mirror=url, executor=executor)   # the same policy
    executor.files(run_dir).checkpoint_step()   # asked of the run's actor on its node
    executor.cluster.health.status()            # the cluster's reachability (ClusterNodes)

Each placement of a run is a detached, named actor (workers/ray_node.py's NodeRun) on a
node with the resources the run's preset asks for (`num_gpus=1` for a CUDA run, else its
`threads` CPUs): the actor starts `crashdrill run … --mirror URL` in a session of its own
there, keeps the run dir on that node's disk, and outlives this server. Its name is kept
in the server's copy of the run dir (ray.json), so a restarted server finds it again
(`adopt`, the Ray form of adopting a trainer by pid).

Records reach the server by offset: each `wait` asks the actor for the complete lines of
records.jsonl and mirror.jsonl after the sizes of the server's copies, and appends them
in one write each. A copy's size is its offset, so a server killed at any point neither
loses nor repeats a line. A new placement is seeded with the server's copies (the node's
files are always the server's copy plus what is not shipped yet).

Every call to an actor tells `cluster.health` (workers/cluster_health.py) whether the
cluster answered; each poll may carry the node's own telemetry sample
(workers/node_telemetry.py), of which `cluster.node_samples` keeps the newest per node
and `cluster.on_node_sample` is told. The run dir on the node is `RayRunFiles`: each of
its calls goes to the run's actor.

A node that dies takes the actor and its trainer with it: the next `wait` reports the host
lost, and the supervisor restarts the run elsewhere (`relocate`), from the newest verified
checkpoint in the mirror, which is why a cluster needs one every node reaches.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# The lab connects once, to the cluster it was given (RayExecutor.connect). Ray's API would
# otherwise connect on first use: a call after that connection closed would join whatever
# cluster pgrep finds on this machine, or start one, and a driver whose cluster goes away
# ends the whole process (exit 1) a minute later. Read when ray is first imported.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.placement_group import (
    NODE_ID_LABEL_KEY,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    PlacementGroupSchedulingStrategy,
)

from crashdrill.trainer.ranks import PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES, PET_NODE_RANK
from crashdrill.trainer.run_files import RANKS_FILE, RUN_JSON
from crashdrill.workers.cluster_health import ClusterNodes
from crashdrill.workers.executor import (
    ExecutorError,
    Host,
    NoRoomForRanks,
    StartCancelled,
    Trainer,
)
from crashdrill.workers.executor_registry import ExecutorConfigError
from crashdrill.workers.mirror_restore import MirrorPull
from crashdrill.workers.rank_crash import RankCrashRefused, RankTarget
from crashdrill.workers.ray_node import SEEDED, SHIPPED, NodeRun
from crashdrill.workers.ray_placement import (
    TELL_S,
    Resources,
    alive_nodes,
    has_room,
    held_by,
    most_ranks_with_room,
    place_s,
    read_placement,
    waiting_event,
    write_placement,
)
from crashdrill.workers.ray_standby import NodeStandbys
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.warm import IMPORT_WAIT_S, NONE

if TYPE_CHECKING:
    from crashdrill.workers.launch import Launch

NAMESPACE = "crashdrill"
CALL_S = 30.0  # one call to an actor
# A start waits for the node's warm process to finish importing (up to the fork server's
# START_TIMEOUT): a fresh actor's on a busy node takes longer than one call may.
START_CALL_S = IMPORT_WAIT_S + CALL_S
CANCEL_POLL_S = 0.5  # a placement that waits looks this often for a Stop
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def host_and_port(address: str) -> tuple[str, int] | None:
    """The (host, port) a TCP check can try: HOST:PORT or ray://HOST:PORT; None: auto."""
    rest = address.removeprefix("ray://")
    if address == "auto" or ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise ExecutorError naming the address when nothing listens there."""
    target = host_and_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as e:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {e}") from None


def same_endpoint(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two (host, port) pairs that name the same listener (loopback names are one)."""
    same_host = a[0] == b[0] or (a[0] in LOOPBACK and b[0] in LOOPBACK)
    return same_host and a[1] == b[1]


def check_connected_to(address: str) -> None:
    """This process's Ray driver, connected before the lab was, must be on the cluster at
    `address` and in the lab's namespace: on another, the lab's actors and placement groups
    would go to a cluster nobody named, and a lookup in another namespace finds none of
    them. Raises ExecutorError naming both; "auto" and ray:// addresses (the client's
    server is not the cluster's GCS) are taken as given."""
    context = ray.get_runtime_context()
    if context.namespace != NAMESPACE:
        raise ExecutorError(
            f"this process is already connected to Ray in namespace {context.namespace!r};"
            f" the lab needs namespace {NAMESPACE!r}: connect it there, or let the lab connect"
        )
    wanted = host_and_port(address)
    if wanted is None or address.startswith("ray://"):
        return
    current = context.gcs_address
    have = host_and_port(current or "")
    if have is None or not same_endpoint(have, wanted):
        raise ExecutorError(
            f"this process is already connected to the Ray cluster at {current},"
            f" not {address}: shut that connection down, or give the lab its address"
        )


class RayTrainer:
    """A trainer on a node, seen through its actor; `wait` also ships its records. A group
    spread over nodes is one trainer too: rank 0's node's launcher (whose records are the
    run's) and its `peers`, the other nodes' launchers, watched and signalled with it."""

    def __init__(
        self,
        executor: RayExecutor,
        run_dir: Path,
        actor: Any,
        where: dict[str, Any],
        peers: list[tuple[Any, Host]] | None = None,
    ) -> None:
        self._executor = executor
        self._run_dir = run_dir
        self._actor = actor  # this trainer's own: a signal never places a new one
        self._peers = list(peers or [])
        self.pid = int(where.get("pid") or 0)
        self.started = float(where.get("started") or 0.0)
        self.host = Host(**where["host"])
        self.lost_host: Host | None = None

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        try:
            answer = self._executor.ship(self._run_dir, self._actor)
            lost = self._lost_peer()
        except (GetTimeoutError, ActorUnavailableError):
            # The cluster is slow or unreachable for now (`_call` told `health`, which the
            # page shows): the trainer keeps training on its node, and its records catch
            # up when the actor answers again.
            time.sleep(max(0.0, deadline - time.monotonic()))
            raise TimeoutError from None
        except RayActorError:
            self._lost(self.host)
            return None
        if lost is not None:
            self._lost(lost)
            return None
        if not answer["running"]:
            self._end_peers()  # the group ends whole, as a launcher ends its ranks
            return answer["code"] if isinstance(answer["code"], int) else None
        time.sleep(max(0.0, deadline - time.monotonic()))
        raise TimeoutError

    def _lost_peer(self) -> Host | None:
        """The host of a peer whose actor died with its node (None: all answer). A peer
        whose launcher ended with a failure (its rank refused its checkpoint, say) ends
        the group, as a launcher ends its ranks: rank 0's node is killed, and the
        supervisor sees the group end."""
        for actor, host in self._peers:
            try:
                answer = self._executor._call(actor, "poll", {})
            except RayActorError:
                return host
            if not answer["running"] and answer["code"] not in (None, 0):
                with contextlib.suppress(RayActorError, GetTimeoutError, ActorUnavailableError):
                    self._executor._call(self._actor, "signal", signal.SIGKILL)
        return None

    def _lost(self, host: Host) -> None:
        self.lost_host = host
        self._executor.lost(self._run_dir, host)

    def _end_peers(self) -> None:
        for actor, _ in self._peers:
            with contextlib.suppress(RayActorError, GetTimeoutError, ActorUnavailableError):
                self._executor._call(actor, "signal", signal.SIGKILL)

    def signal(self, sig: int) -> None:
        try:
            sent = self._executor._call(self._actor, "signal", sig)
        except (RayActorError, GetTimeoutError):
            raise ProcessLookupError(self.pid) from None
        for actor, _ in self._peers:  # every node's launcher of a spread group
            with contextlib.suppress(RayActorError, GetTimeoutError, ActorUnavailableError):
                self._executor._call(actor, "signal", sig)
        if not sent:
            raise ProcessLookupError(self.pid)


class RayRunFiles:
    """The run dir on the run's node, through its actor (placing one when it has none)."""

    def __init__(self, executor: RayExecutor, run_dir: Path) -> None:
        self._executor = executor
        self._run_dir = run_dir

    def checkpoint_step(self) -> int | None:
        """The newest checkpoint on the run's node; for a group spread over nodes, the one
        every node holds (None where they differ: a node new to the group holds none)."""
        step = self._executor.call(self._run_dir, "checkpoint_step")
        for actor in self._executor.peers(self._run_dir):
            if self._executor._call(actor, "checkpoint_step") != step:
                return None
        return int(step) if step is not None else None

    def wipe(self) -> None:
        self._executor.call(self._run_dir, "wipe")
        for actor in self._executor.peers(self._run_dir):  # every node's disk of the group
            self._executor._call(actor, "wipe")

    def pull_from_mirror(self, url: str, segment: int) -> MirrorPull:
        """The mirror's newest verified checkpoint; for a spread group onto every node,
        each node's own copies wiped first (a node that kept its disk may hold a newer
        step than the mirror, which the new nodes cannot have: every rank must resume the
        same one). Rank 0's answer: its events are the run's."""
        peers = self._executor.peers(self._run_dir)
        if peers:
            self.wipe()
        pull: MirrorPull = self._executor.call(self._run_dir, "pull", url, segment)
        for actor in peers:
            self._executor._call(actor, "pull", url, segment)
        return pull

    def append_records(self, records: list[dict[str, Any]]) -> None:
        """On the node, after the trainer's own lines, then shipped; with no live actor,
        into the server's copy (which seeds the next placement)."""
        self._executor.append_records(self._run_dir, records)

    def stderr_size(self) -> int:
        return int(self._executor.call(self._run_dir, "stderr_size"))

    def stderr_since(self, offset: int) -> bytes:
        data: bytes = self._executor.call(self._run_dir, "stderr_since", offset)
        return data

    def stderr_tail(self, since: int) -> str:
        """Rank 0's node's, then each other node's of a spread group, since its start."""
        tail = str(self._executor.call(self._run_dir, "stderr_tail", since))
        for k, (actor, host) in enumerate(self._executor.peers_with_hosts(self._run_dir), 1):
            peer_since = self._executor.peer_stderr_since(self._run_dir, k)
            with contextlib.suppress(RayActorError, GetTimeoutError, ActorUnavailableError):
                more = str(self._executor._call(actor, "stderr_tail", peer_since)).strip()
                if more:
                    tail += f"\n[node {k}, {host.name}]\n{more}"
        return tail

    def kill_rank(self, launcher: int) -> RankTarget:
        """On the node, by its actor (which knows its trainer: `launcher` is its pid)."""
        try:
            answer: dict[str, Any] = self._executor.call(self._run_dir, "kill_rank")
            for peer in self._executor.peers(self._run_dir):  # the node that has the rank
                if not answer.get("elsewhere"):
                    break
                answer = self._executor._call(peer, "kill_rank")
        except (RayActorError, GetTimeoutError):
            raise RankCrashRefused("the run's node does not answer") from None
        if "refused" in answer:
            raise RankCrashRefused(str(answer["refused"]))
        return RankTarget.from_dict(answer)


class RayExecutor:
    """Runs on a Ray cluster this process is connected to (see `connect`)."""

    name = "ray"

    def __init__(self, mirror: str, address: str | None = None) -> None:
        self.mirror = mirror
        self.cluster = ClusterNodes("ray", address, self.runs_on)
        self._lock = threading.Lock()
        self._actors: dict[Path, Any] = {}  # run dir -> actor handle of its placement
        self._hosts: dict[Path, Host] = {}
        self._launches: dict[Path, Launch] = {}
        self._cancelled: set[Path] = set()  # runs stopped while their start waits (cancel)
        self._ship_locks: dict[Path, threading.Lock] = {}
        self._groups: dict[Path, Any] = {}  # run dir -> placement group of its ranks
        # A group spread over nodes: the actors of its other nodes (rank 0's is _actors'),
        # in node rank order, and the host whose loss a trainer saw (relocate avoids it).
        self._peers: dict[Path, list[tuple[Any, Host]]] = {}
        self._lost: dict[Path, Host] = {}
        self._peer_stderr: dict[Path, list[int]] = {}  # each peer's stderr size at start
        self._remote = ray.remote(NodeRun)
        self._standbys = NodeStandbys(self._remote, NAMESPACE)

    @classmethod
    def connect(cls, address: str, mirror: str) -> RayExecutor:
        """Connect this process to the cluster at `address` (auto, HOST:PORT, ray://…);
        raises ExecutorError naming it when it cannot."""
        check_reachable(address)
        target = host_and_port(address)
        loopback = target is not None and target[0] in LOOPBACK
        if loopback:  # a cluster on this machine stays on 127.0.0.1 (else Ray rewrites it)
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False}
        if loopback and not address.startswith("ray://"):
            kwargs["_node_ip_address"] = "127.0.0.1"
        if ray.is_initialized():
            check_connected_to(address)
            return cls(mirror, address)
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:
            raise ExecutorError(f"cannot connect to the Ray cluster at {address}: {e}") from None
        return cls(mirror, address)

    # ---- the Executor protocol ------------------------------------------------------

    def prepare(self, launch: Launch) -> None:
        self._launches[launch.run_dir] = launch

    def start(self, launch: Launch, env: Mapping[str, str], *, require_checkpoint: bool) -> Trainer:
        self._launches[launch.run_dir] = launch
        actor = self._actor(launch.run_dir)
        argv, where = self._node_argv(actor, launch, require_checkpoint)
        env = {**env, "PYTHONUNBUFFERED": "1"}
        peers = self.peers_with_hosts(launch.run_dir)
        if not peers:
            argv += ["--mirror", self.mirror]
            where = self._call(actor, "start", argv, env, timeout=START_CALL_S)
        else:
            where = self._start_spread(actor, where, peers, launch, argv, env, require_checkpoint)
        self._standbys.top_up()  # the node's next spare warms once this trainer has started
        return RayTrainer(self, launch.run_dir, actor, where, peers)

    def _node_argv(
        self, actor: Any, launch: Launch, require_checkpoint: bool
    ) -> tuple[list[str | None], dict[str, Any]]:
        """The trainer's command on `actor`'s node (its run dir there; argv[0] None: the
        node's own Python), and the actor's where()."""
        where: dict[str, Any] = self._call(actor, "where")
        run_dir = Path(where["run_dir"])
        argv: list[str | None] = list(
            launch.argv(require_checkpoint=require_checkpoint, run_dir=run_dir)
        )
        if tuple(launch.command[:1]) == (sys.executable,):
            argv[0] = None
        return argv, where

    def _start_spread(
        self,
        actor: Any,
        where0: dict[str, Any],
        peers: list[tuple[Any, Host]],
        launch: Launch,
        argv: list[str | None],
        env: dict[str, str],
        require_checkpoint: bool,
    ) -> dict[str, Any]:
        """A group spread over nodes: a launcher on each node, told its place by torchrun's
        PET_* names (trainer/ranks.py NodeSpec), all started at once. Rank 0's node (this
        run's actor) copies the checkpoints to the mirror; every node's disk holds each
        whole checkpoint (dcp_checkpoint._share_files), so one copy is the group's."""
        port = int(self._call(actor, "free_port"))
        nodes = 1 + len(peers)

        def node_env(k: int) -> dict[str, str]:
            return {**env, PET_NNODES: str(nodes), PET_NODE_RANK: str(k),
                    PET_MASTER_ADDR: str(where0["ip"]), PET_MASTER_PORT: str(port)}  # fmt: skip

        refs, since = [], []
        for k, (peer, _) in enumerate(peers, start=1):
            since.append(int(self._call(peer, "stderr_size")))
            peer_argv, _ = self._node_argv(peer, launch, require_checkpoint)
            refs.append(peer.start.remote(peer_argv, node_env(k)))
        where = self._call(actor, "start", [*argv, "--mirror", self.mirror], node_env(0),
                           timeout=START_CALL_S)  # fmt: skip
        ray.get(refs, timeout=START_CALL_S)
        with self._lock:  # where each node's error output of this start begins
            self._peer_stderr[launch.run_dir] = since
        return dict(where)

    def peer_stderr_since(self, run_dir: Path, k: int) -> int:
        """The size of node k's stderr (k ≥ 1) when the group's trainer started there."""
        with self._lock:
            sizes = self._peer_stderr.get(run_dir, [])
        return sizes[k - 1] if k - 1 < len(sizes) else 0

    def peers(self, run_dir: Path) -> list[Any]:
        """The actors of a spread group's other nodes (none for a packed run)."""
        return [a for a, _ in self.peers_with_hosts(run_dir)]

    def peers_with_hosts(self, run_dir: Path) -> list[tuple[Any, Host]]:
        with self._lock:
            return list(self._peers.get(run_dir, []))

    def lost(self, run_dir: Path, host: Host) -> None:
        """A trainer saw `host` lost: the next relocate avoids that node."""
        with self._lock:
            self._lost[run_dir] = host

    def adopt(self, run_dir: Path, pids: Iterable[int | None]) -> Trainer | None:
        """The run's actor, found by the name the server kept (None: it is gone)."""
        name = read_placement(run_dir).get("actor")
        if not name:
            return None
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            where = self._call(actor, "where")
        except (ValueError, RayActorError, GetTimeoutError):
            return None
        peers: list[tuple[Any, Host]] = []
        for peer_name in read_placement(run_dir).get("peers") or []:
            try:
                peer = ray.get_actor(peer_name, namespace=NAMESPACE)
                peers.append((peer, Host(**self._call(peer, "where")["host"])))
            except (ValueError, RayActorError, GetTimeoutError):
                return None  # a node of its group is gone: resumed as a dead trainer
        with self._lock:
            self._actors[run_dir] = actor
            self._hosts[run_dir] = Host(**where["host"])
            self._peers[run_dir] = peers
        return RayTrainer(self, run_dir, actor, where, peers)

    def host(self, run_dir: Path) -> Host | None:
        """Where the run trains, or last trained (kept in ray.json)."""
        with self._lock:
            host = self._hosts.get(run_dir)
        if host is None:
            kept = read_placement(run_dir)
            if kept.get("node_id"):
                host = Host(str(kept["node_id"]), str(kept.get("name", kept["node_id"])))
        return host

    def files(self, run_dir: Path) -> RayRunFiles:
        return RayRunFiles(self, run_dir)

    def append_records(self, run_dir: Path, records: list[dict[str, Any]]) -> None:
        """On the node, after the trainer's own lines, then shipped; with no live actor,
        into the server's copy (which seeds the next placement)."""
        with self._lock:
            actor = self._actors.get(run_dir)
        if actor is not None:
            try:
                self._call(actor, "append", records)
                self.ship(run_dir, actor)
                return
            except RayActorError:
                self._forget(run_dir)
        RunDir(run_dir).append_records(records)

    def relocate(self, run_dir: Path) -> Host | None:
        """Move the run to another node (its trainer is dead): the old actor goes, a new
        one is placed elsewhere and seeded; None when no other node is alive."""
        with self._lock:
            actor = self._actors.get(run_dir)
            lost = self._lost.get(run_dir)  # kept until placed: a retry on fewer ranks
        # The node to move off: the one a trainer saw lost (a spread group's may be any of
        # its nodes), else rank 0's (a crash test that takes its host away).
        old = lost or self.host(run_dir)
        others = [n for n in alive_nodes() if old is None or n != old.node_id]
        if old is not None and not others:
            return None
        need = self._need(run_dir)
        avoid = old.node_id if old is not None else None
        own = held_by(self._group_of(run_dir)) if need.ranks > 1 else {}
        if need.ranks > 1 and not has_room(need, avoid, own):
            # Said now, not waited for: the supervisor restarts it on `fits` ranks where
            # its checkpoint reshards, else the run ends saying why.
            fits = most_ranks_with_room(need, avoid, own)
            room = f"; one has room for {fits}" if fits else ""
            raise NoRoomForRanks(
                f"no node left has {need.text()} free for its {need.ranks} ranks{room}",
                ranks=need.ranks,
                fits=fits,
            )
        for gone in [actor, *self.peers(run_dir)]:
            if gone is None:
                continue
            # Its trainer killed now, not when Ray gets to the actor: a spread group's new
            # placement may take the same node (and its run dir) while the old rank 0,
            # its peer's loss not yet seen, still writes checkpoints there.
            with contextlib.suppress(Exception):  # already gone with its node
                self._call(gone, "signal", signal.SIGKILL, timeout=5.0)
            with contextlib.suppress(Exception):
                ray.kill(gone)
        self._remove_group(run_dir)  # else Ray would reschedule its bundles by itself
        self._forget(run_dir)
        self._actor(run_dir, avoid=avoid)
        with self._lock:
            self._lost.pop(run_dir, None)
        return self.host(run_dir)

    def release(self, run_dir: Path) -> None:
        """The run ended: its last lines shipped, its actor (and node dir) gone."""
        with self._lock:
            self._cancelled.discard(run_dir)
            actor = self._actors.get(run_dir)
        if actor is None:
            return
        with contextlib.suppress(RayActorError, GetTimeoutError):
            self.ship(run_dir, actor)
            self._call(actor, "close")
        for peer in self.peers(run_dir):
            with contextlib.suppress(RayActorError, GetTimeoutError):
                self._call(peer, "close")
        for gone in [actor, *self.peers(run_dir)]:
            with contextlib.suppress(Exception):
                ray.kill(gone)
        self._remove_group(run_dir)
        self._forget(run_dir)
        self._launches.pop(run_dir, None)

    # ---- shipping and calls ---------------------------------------------------------

    def ship(self, run_dir: Path, actor: Any) -> dict[str, Any]:
        """Append the node's new complete lines (from `actor`, the run's placement) to the
        server's copies until none is left; the last poll's answer (running, code)."""
        with self._lock:
            lock = self._ship_locks.setdefault(run_dir, threading.Lock())
        with lock:
            while True:
                offsets = {name: _size(run_dir / name) for name in SHIPPED}
                answer: dict[str, Any] = self._call(actor, "poll", offsets, self.cluster.telemetry)
                self.cluster.took_sample(answer.get("telemetry"))
                got = False
                if answer.get("run_json"):
                    _replace_bytes(run_dir / RUN_JSON, answer["run_json"])
                if answer.get("ranks_json"):  # the page's rank states, a rank crash's event
                    _replace_bytes(run_dir / RANKS_FILE, answer["ranks_json"])
                for name, chunk in answer["chunks"].items():
                    if chunk:
                        _append_bytes(run_dir / name, chunk)
                        got = True
                if not got:
                    return answer

    def runs_on(self, node_id: str) -> list[str]:
        """The runs (their run dirs' names) placed on that node now."""
        with self._lock:
            return [d.name for d, h in self._hosts.items() if h.node_id == node_id]

    def call(self, run_dir: Path, method: str, *args: Any) -> Any:
        """Call the run's actor (placing one when it has none)."""
        return self._call(self._actor(run_dir), method, *args)

    def _call(self, actor: Any, method: str, *args: Any, timeout: float = CALL_S) -> Any:
        try:
            answer = ray.get(getattr(actor, method).remote(*args), timeout=timeout)
        except (GetTimeoutError, ActorUnavailableError) as e:
            self.cluster.health.failed(f"{type(e).__name__}: {e}"[:300])
            raise
        self.cluster.health.ok()
        return answer

    def _actor(self, run_dir: Path, avoid: str | None = None) -> Any:
        with self._lock:
            actor = self._actors.get(run_dir)
        if actor is not None:
            return actor
        return self._place(run_dir, avoid)

    def _place(self, run_dir: Path, avoid: str | None) -> Any:
        """A new actor for the run, on a node with its resources (not `avoid`), seeded
        with the server's copies of the files the trainer appends to.

        Ray reserves the run's resources as a placement group, one bundle per rank, all on
        one node (STRICT_PACK: the launcher forks every rank from that node's warm
        process); a run moved off a node asks for any node but that one. On the group's
        node the run takes the node's standby (workers/ray_standby.py), whose warm process
        is ready, or else gets an actor of its own in bundle 0."""
        need = self._need(run_dir)
        attempt = int(read_placement(run_dir).get("attempt", 0)) + 1
        name = f"crashdrill-{run_dir.name}-{attempt}"
        kept = {"actor": name, "placement_group": f"{name}-ranks", "attempt": attempt}
        group = placement_group(
            need.bundles(),
            strategy=need.strategy,
            name=kept["placement_group"],
            lifetime="detached",
            bundle_label_selector=[{NODE_ID_LABEL_KEY: f"!{avoid}"}] * need.ranks
            if avoid
            else None,
        )
        with self._lock:
            self._groups[run_dir] = group
        placed: list[tuple[Any, dict[str, Any]]] = []  # (actor, where) per node of the group
        try:
            self._placed(group.ready(), run_dir, need)
            nodes = placement_group_table(group)["bundles_to_node_id"]
            for k in range(need.nodes):  # rank 0's node first: bundle k holds node k's ranks
                bundle = k * need.per_node
                actor_name = name if k == 0 else f"{name}-node{k}"
                placed.append(self._node_actor(group, bundle, str(nodes[bundle]), actor_name,
                                               run_dir, need))  # fmt: skip
        except BaseException:
            for actor, _ in placed:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            self._remove_group(run_dir)
            raise
        seed = {n: (run_dir / n).read_bytes() for n in SEEDED if (run_dir / n).exists()}
        for actor, _ in placed:  # after any waiting event: the copies agree
            self._call(actor, "seed", seed)
        (actor, where), peers = placed[0], placed[1:]
        kept["actor"] = where["actor"]
        if peers:
            kept["peers"] = [w["actor"] for _, w in peers]
        write_placement(run_dir, {**kept, **where["host"]})
        with self._lock:
            self._actors[run_dir] = actor
            self._hosts[run_dir] = Host(**where["host"])
            self._peers[run_dir] = [(a, Host(**w["host"])) for a, w in peers]
        return actor

    def _node_actor(
        self, group: Any, bundle: int, node: str, name: str, run_dir: Path, need: Resources
    ) -> tuple[Any, dict[str, Any]]:
        """The run's actor on one node of its group: the node's standby, whose warm process
        is ready, or an actor of its own in `bundle` (a GPU run always: Ray tells GPU ids
        only to an actor placed in the bundle). Its `where`, with the actor's name."""
        taken = None if need.num_gpus else self._standbys.take(node, run_dir.name)
        if taken is not None:
            spare, taken_name, where = taken
            return spare, {**where, "actor": taken_name}
        actor: Any = self._remote.options(  # a Ray actor handle: its .remote is not typed
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=need.num_cpus,
            num_gpus=need.num_gpus,
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=bundle
            ),
        ).remote(run_dir.name)
        try:
            where = self._placed(actor.where.remote(), run_dir, need)
        except BaseException:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            raise
        return actor, {**where, "actor": name}

    def _need(self, run_dir: Path) -> Resources:
        launch = self._launches.get(run_dir)
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        return Resources.of_launch(launch, gpus=gpus) if launch else Resources(1, 0)

    def _placed(self, ref: Any, run_dir: Path, need: Resources) -> Any:
        """Wait for `ref` (the group placed, the actor up); past TELL_S the run's log says
        what it waits for (a node that joins the cluster counts), and past place_s it
        fails. The caller removes what it placed."""
        start = time.monotonic()
        deadline = start + place_s()
        told = False
        while True:
            ready, _ = ray.wait([ref], timeout=CANCEL_POLL_S)
            if ready:
                return ray.get(ready[0])
            if self._take_cancel(run_dir):  # a Stop while it waits: no node is taken
                raise StartCancelled(f"run {run_dir.name} was stopped while it waited for a node")
            if not told and time.monotonic() - start >= TELL_S:
                RunDir(run_dir).append_records([waiting_event(run_dir, need)])
                told = True
            if time.monotonic() > deadline:
                raise ExecutorError(
                    f"no node of the Ray cluster could take run {run_dir.name} within"
                    f" {place_s():.0f}s (it needs {need.text()})"
                )

    def open(self) -> None:
        """A standby on each node, its warm process importing while the lab starts."""
        self._standbys.top_up()

    def starts(self) -> dict[str, Any]:
        """Each node's run actor forks its trainers from a warm process of its own."""
        return {"mode": "node", "warm": NONE, "pid": None, "forked": 0, "exec": 0, "error": None}

    def close(self) -> None:
        """The nodes' standbys go; the runs' actors belong to their runs."""
        self._standbys.close()

    def cancel(self, run_dir: Path) -> None:
        """A Stop before the trainer exists: a placement waiting for a node gives up."""
        with self._lock:
            self._cancelled.add(run_dir)

    def _take_cancel(self, run_dir: Path) -> bool:
        with self._lock:
            if run_dir in self._cancelled:
                self._cancelled.discard(run_dir)
                return True
            return False

    def _group_of(self, run_dir: Path, *, forget: bool = False) -> Any:
        """The run's placement group (a restarted server finds it by its kept name)."""
        with self._lock:
            group = self._groups.pop(run_dir, None) if forget else self._groups.get(run_dir)
        if group is None:
            name = read_placement(run_dir).get("placement_group")
            with contextlib.suppress(Exception):
                group = get_placement_group(name) if name else None
        return group

    def _remove_group(self, run_dir: Path) -> None:
        """The run's placement group goes."""
        group = self._group_of(run_dir, forget=True)
        if group is not None:
            with contextlib.suppress(Exception):  # already removed
                remove_placement_group(group)

    def _forget(self, run_dir: Path) -> None:
        with self._lock:
            self._actors.pop(run_dir, None)
            self._hosts.pop(run_dir, None)
            self._peers.pop(run_dir, None)


class RaySettings(Protocol):
    """What the Ray executor reads of the lab's settings."""

    @property
    def ray_address(self) -> str | None: ...

    @property
    def mirror_url(self) -> str | None: ...


def from_settings(settings: RaySettings) -> RayExecutor:
    """Connect to the cluster at `ray_address`; ExecutorConfigError naming the setting."""
    address, mirror = settings.ray_address, settings.mirror_url
    where = "--ray-address, CRASHDRILL_RAY_ADDRESS"
    if not address:
        raise ExecutorConfigError(
            f"executor = 'ray' needs ray_address ({where}): auto, HOST:PORT or ray://HOST:PORT"
        )
    if mirror is None:  # Settings refuses this already; kept for a hand-built Settings
        raise ExecutorConfigError(f"ray_address = {address!r} needs a checkpoint mirror (--mirror)")
    try:
        return RayExecutor.connect(address, mirror)
    except ExecutorError as e:
        raise ExecutorConfigError(f"ray_address = {address!r} ({where}): {e}") from None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _append_bytes(path: Path, data: bytes) -> None:
    """Complete lines, in one write (a reader never sees half of what was shipped)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _replace_bytes(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

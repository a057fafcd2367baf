"""The cluster side of one run: a Ray actor that owns the run's trainer on its node.

    actor = ray.remote(NodeRun).options(name=..., lifetime="detached").remote(run_id)
    standby = ray.remote(NodeRun).options(num_cpus=0, ...).remote(None)   # a node's spare
    standby.take.remote(run_id)             # ...becomes that run's: its warm process is ready
    actor.seed.remote({"records.jsonl": b"...", ...})   # the server's copies, once placed
    actor.start.remote(argv, env)           # `crashdrill run …` in its own session, here
    actor.poll.remote({"records.jsonl": 1234, "mirror.jsonl": 0}, {"interval_s": 2.0})
                                            # status + new bytes (+ the node's telemetry)
    actor.signal.remote(SIGKILL)            # the trainer's whole process group
    actor.wipe.remote()                     # its checkpoints on this node's disk

workers/ray_executor.py creates one per placement of a run and talks to it; this module is
what runs on the node, so it imports nothing of the server. The run dir lives on the
node's own disk (CRASHDRILL_NODE_DIR, else the temp dir, then the node id: nodes sharing
one machine in a test keep separate "disks"). A new placement is seeded with the server's
copy of records.jsonl, mirror.jsonl and run.json, so the node's files are always that copy
followed by what is not shipped yet: the server asks for bytes from its copy's sizes
(`poll`), which makes shipping idempotent across a server or actor restart. A poll's answer
also carries this node's telemetry sample when one is due (workers/node_telemetry.py:
one sampler per node, at most one sample per interval, whatever the number of actors).

A crash test's SIGKILL takes the trainer's whole process tree on the node, whatever
sessions its children made (the same kill as on one machine: workers/trainer_process.py).
The trainer gets SIGKILL when the actor's process dies (PR_SET_PDEATHSIG): a node that is
removed takes its trainer with it, instead of leaving an orphan that still writes to the
mirror while the run resumes elsewhere. The actor keeps a warm trainer process (workers/
warm.py) from which it forks the trainer: a crash test's restart on this node does not pay
`import torch` again; where that process is missing the trainer is exec'd as before.
A node's standby (created with no run, holding no resources: the run's placement group
reserves them) has its warm process ready before any run needs it, so a run moved to the
node after a lost host forks at once instead of importing torch there (`take`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from crashdrill.processes.process_tree import become_subreaper
from crashdrill.trainer.checkpoint_layout import ckpt_root
from crashdrill.trainer.run_files import (
    FROZEN_PRESET,
    MIRROR_LOG,
    RANKS_FILE,
    RECORDS_FILE,
    RUN_JSON,
    read_complete_lines,
)
from crashdrill.workers.executor import Host
from crashdrill.workers.mirror_restore import MirrorPull, pull_for_restart
from crashdrill.workers.node_telemetry import NodeTelemetry
from crashdrill.workers.rank_crash import RankCrashRefused, RankElsewhere, kill_rank
from crashdrill.workers.run_dir import RunDir
from crashdrill.workers.trainer_env import GCS_ENV_NAMES, writes_gcs_mirror
from crashdrill.workers.trainer_process import TrainerProcess
from crashdrill.workers.warm import READY, WarmTrainers

SHIPPED = (RECORDS_FILE, MIRROR_LOG)  # the files the server keeps a copy of, by offset
SEEDED = (*SHIPPED, RUN_JSON, FROZEN_PRESET)  # the preset text a frozen run trains
MAX_CHUNK = 1 << 20  # bytes of one file in one poll
STANDBY = ".standby"  # the run dir's name while the actor is a node's spare (no run yet)


def node_root(node_id: str) -> Path:
    base = os.environ.get("CRASHDRILL_NODE_DIR") or str(Path(tempfile.gettempdir()))
    return Path(base) / "crashdrill-node" / node_id[:16]


def complete_lines(path: Path, offset: int, limit: int = MAX_CHUNK) -> bytes:
    """The bytes of `path` from `offset` up to its last newline (at most `limit`)."""
    try:
        return read_complete_lines(path, offset, limit).data
    except OSError:
        return b""


class NodeRun:
    """One run's trainer on this node (one actor per placement of the run)."""

    def __init__(self, run_id: str | None) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        # The GPUs Ray gave this placement ("" for a CPU run: it must not take one).
        self.gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        self.run_dir = RunDir(node_root(self.node_id) / (run_id or STANDBY))
        if run_id is not None:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
        self.host = Host(self.node_id, f"{socket.gethostname()}/{self.node_id[:8]}")
        self.ip = ray.util.get_node_ip_address()  # where a spread group's peers reach rank 0
        self.telemetry = NodeTelemetry(node_root(self.node_id), self.host)
        self.proc: TrainerProcess | None = None
        self.code: int | None = None
        become_subreaper()  # the trainer's orphaned descendants stay findable for a kill
        # The node's warm trainer process for this placement: a crash test's restart forks
        # instead of importing torch again; it and its trainer die with this actor.
        self.warm = WarmTrainers(die_with_parent=True)
        self.warm.prewarm()

    def take(self, run_id: str) -> dict[str, Any]:
        """A standby becomes the placement of run `run_id` on this node (where())."""
        self.run_dir = RunDir(node_root(self.node_id) / run_id)
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        return self.where()

    def spare_on(self) -> str | None:
        """This node's id while this actor is a standby nobody has taken; else None."""
        return self.node_id if self.run_dir.path.name == STANDBY else None

    def warm_ready(self) -> bool:
        return bool(self.warm.status()["warm"] == READY)

    def seed(self, files: dict[str, bytes]) -> None:
        """The server's copies, before anything else writes here (the trainer counts its
        starts in run.json); a file the server has not is removed."""
        for name in SEEDED:
            target = self.run_dir.path / name
            if name in files:
                target.write_bytes(files[name])
            else:
                target.unlink(missing_ok=True)

    def where(self) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None else None
        started = self.proc.started if self.proc is not None else None
        host = self.host.to_dict()
        return {"host": host, "run_dir": str(self.run_dir.path), "pid": pid, "started": started,
                "ip": self.ip}  # fmt: skip

    def free_port(self) -> int:
        """A port free on this node now, for the store of a group whose rank 0 runs here
        (the peers on other nodes must know it before rank 0 opens it), as torch's
        elastic agent picks one (bind port 0, close): taken meanwhile, rank 0 fails to
        open its store and the group restarts."""
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def start(self, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        """Start the trainer (argv[0] None: this node's Python) in its own session."""
        argv = [sys.executable if a is None else a for a in argv]
        env = {**env, "CUDA_VISIBLE_DEVICES": self.gpus}  # the node's say, not the server's
        if writes_gcs_mirror(argv):  # it copies to GCS itself: the node's credentials
            env.update({k: os.environ[k] for k in GCS_ENV_NAMES if k in os.environ})
        rd = self.run_dir
        with open(rd.stdout, "ab") as out, open(rd.stderr, "ab") as err:
            self.proc = TrainerProcess.start(
                argv, env, stdout=out, stderr=err, warm=self.warm, die_with_parent=True
            )
        self.code = None
        return self.where()

    def poll(
        self, offsets: dict[str, int], telemetry: dict[str, float] | None = None
    ) -> dict[str, Any]:
        """Whether the trainer runs, its exit status once it ended, and each shipped file's
        complete lines after the server's offset (read after the status: an ended
        trainer's last lines are in the answer), and run.json as it is now; `telemetry`
        (the node sampler's settings) asks for this node's sample when one is due."""
        running = False
        if self.proc is not None and self.code is None:
            try:
                self.code = self.proc.wait(0)
            except TimeoutError:
                running = True
        chunks = {n: complete_lines(self.run_dir.path / n, off) for n, off in offsets.items()}
        try:
            run_json: bytes | None = (self.run_dir.path / RUN_JSON).read_bytes()
        except OSError:
            run_json = None
        try:  # a group's launcher's ranks file (trainer/ranks.py), rewritten whole
            ranks_json: bytes | None = (self.run_dir.path / RANKS_FILE).read_bytes()
        except OSError:
            ranks_json = None
        sample = self.telemetry.due(**telemetry) if telemetry else None
        return {
            "running": running,
            "code": self.code,
            "chunks": chunks,
            "run_json": run_json,
            "ranks_json": ranks_json,
            "telemetry": sample,
        }

    def signal(self, sig: int) -> bool:
        """SIGKILL: the trainer's whole process tree (crashdrill/processes/process_tree.py), as
        on the server's machine; another signal: its process group. False when it is not running."""
        if self.proc is None:
            return False
        try:
            self.proc.signal(sig)
        except (ProcessLookupError, OSError):
            return False
        return True

    def kill_rank(self) -> dict[str, Any]:
        """A rank crash of this node's group: the rank killed (RankTarget.to_dict), or
        {"refused": why}."""
        if self.proc is None or self.code is not None:
            return {"refused": "the trainer is not running"}
        try:
            return kill_rank(self.run_dir, self.proc.pid).to_dict()
        except RankElsewhere as e:  # a spread group's: the executor asks the next node
            return {"refused": str(e), "elsewhere": True}
        except RankCrashRefused as e:
            return {"refused": str(e)}

    def wipe(self) -> None:
        import shutil

        shutil.rmtree(ckpt_root(self.run_dir.path), ignore_errors=True)

    def checkpoint_step(self) -> int | None:
        return self.run_dir.latest_checkpoint_step()

    def pull(self, url: str, segment: int) -> MirrorPull:
        return pull_for_restart(url, self.run_dir.path, segment)

    def append(self, records: list[dict[str, Any]]) -> None:
        self.run_dir.append_records(records)

    def close(self) -> None:
        """The run ended: the node's copy of its files goes (the mirror has its
        checkpoints, the server its records)."""
        import shutil

        if self.proc is not None and self.code is None:
            self.signal(signal.SIGKILL)
        self.warm.close()
        self.telemetry.close()  # another run's actor on this node samples it from now on
        shutil.rmtree(self.run_dir.path, ignore_errors=True)

    def stderr_size(self) -> int:
        return self.run_dir.stderr_size()

    def stderr_since(self, offset: int) -> bytes:
        return self.run_dir.stderr_since(offset, MAX_CHUNK)

    def stderr_tail(self, since: int) -> str:
        return self.run_dir.stderr_tail(since=since)

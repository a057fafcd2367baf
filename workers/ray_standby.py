"""A spare run actor on each node of a Ray cluster, its warm trainer process already
importing torch, so a run placed there (above all one moved off a lost host) forks its
trainer at once instead of paying a cold `import torch` on the node.

    standbys = NodeStandbys(remote=ray.remote(NodeRun), namespace="crashdrill")
    standbys.top_up()                          # one per live node that has none (async)
    taken = standbys.take(node_id, "run-7")    # (actor, name, where) or None
    standbys.close()                           # the spares go; runs keep theirs

A standby is a detached actor named `crashdrill-standby-NODE-ID` pinned to its node, with
no resources of its own: the run that takes it has its placement group's bundles reserved
on that node (workers/ray_executor.py), so Ray's accounting stays the run's. The actor
becomes that run's placement (`NodeRun.take`); its name goes into ray.json like any other,
so a restarted server adopts it by name. A restarted server also adopts the spares its
predecessor left (the named standbys that are still nobody's run). A GPU run does not
take one: Ray tells the GPU ids only to an actor placed in the bundle that reserved them.

On the 2-core development machine a cold warm process takes 6-10 s to import torch and
the ranks' modules under load: without a standby that is most of a lost host's cost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any, cast

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)

PREFIX = "crashdrill-standby-"
TAKE_S = 10.0  # a standby that does not answer this fast is passed over


class NodeStandbys:
    """At most one spare actor per live node (this server's; a restart makes new ones)."""

    def __init__(self, remote: Any, namespace: str) -> None:
        self._remote = remote
        self._namespace = namespace
        self._lock = threading.Lock()
        self._spares: dict[str, tuple[Any, str]] = {}  # node id -> (actor, name)
        self._closed = False
        self._adopted = False

    def top_up(self) -> None:
        """A spare on every live node with CPUs that has none (created in the background:
        Ray starts the actor and its warm process while this returns)."""
        alive = {
            str(n["NodeID"])
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
        }
        if not self._adopted:
            self._adopted = True
            self._adopt(alive)
        with self._lock:
            if self._closed:
                return
            for node in list(self._spares):
                if node not in alive:  # gone with its node
                    self._spares.pop(node)
            for node in alive - set(self._spares):
                name = f"{PREFIX}{node[:12]}-{uuid.uuid4().hex[:8]}"
                actor = self._remote.options(
                    name=name,
                    namespace=self._namespace,
                    lifetime="detached",
                    num_cpus=0,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(None)
                self._spares[node] = (actor, name)

    def _adopt(self, alive: set[str]) -> None:
        """The spares a previous server left on live nodes (a SIGKILLed one cannot remove
        them): one per node is kept, any other goes."""
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = str(entry.get("name", ""))
            if entry.get("namespace") != self._namespace or not name.startswith(PREFIX):
                continue
            try:
                actor = ray.get_actor(name, namespace=self._namespace)
                node = cast("str | None", ray.get(actor.spare_on.remote(), timeout=TAKE_S))
            except (ValueError, RayActorError, GetTimeoutError):
                continue
            if node is None:  # a run's placement now
                continue
            with self._lock:
                keep = node in alive and node not in self._spares
                if keep:
                    self._spares[node] = (actor, name)
            if not keep:
                with contextlib.suppress(Exception):
                    ray.kill(actor)

    def take(self, node_id: str, run_id: str) -> tuple[Any, str, dict[str, Any]] | None:
        """The node's spare, now run `run_id`'s placement: (actor, its name, where());
        None when the node has none that answers."""
        with self._lock:
            spare = self._spares.pop(node_id, None)
        if spare is None:
            return None
        actor, name = spare
        try:
            where: dict[str, Any] = ray.get(actor.take.remote(run_id), timeout=TAKE_S)
        except (RayActorError, GetTimeoutError) as e:
            log.info("standby %s passed over: %s", name, type(e).__name__)
            with contextlib.suppress(Exception):
                ray.kill(actor)
            return None
        return actor, name, where

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = list(self._spares.values()), {}
        for actor, _ in spares:
            with contextlib.suppress(Exception):
                ray.kill(actor)

"""A Ray cluster on 127.0.0.1 for the `ray` tier: a head that takes no runs and worker
nodes that do, started in this process with ray.cluster_utils.Cluster, with the lab's
node health check (workers/ray_placement.py NODE_HEALTH_CHECK: a lost node in ~1.5 s).

    cluster = start_cluster(nodes=2)      # ~15-25 s on a 2-core machine
    with running_cluster(nodes=3) as cluster: ...   # the same, shut down (and ray too) after
    cluster.address                       # "127.0.0.1:PORT", for --ray / RayExecutor
    cluster.remove_node(node)             # a host that is lost

Every process of the tier (this one, the servers it starts, their trainers) needs
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, else Ray rewrites 127.0.0.1 to the machine's
interface address and a driver hangs on connect: importing this module sets it.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

OBJECT_STORE = 80 * 1024 * 1024
NODE_CPUS = 2


def node_args(**kw: Any) -> dict[str, Any]:
    return {
        "node_ip_address": "127.0.0.1",
        "object_store_memory": OBJECT_STORE,
        "num_cpus": NODE_CPUS,
        **kw,
    }


def start_cluster(nodes: int = 2) -> Any:
    """A head (no CPUs: runs go to the workers) and `nodes` worker nodes, connected."""
    from ray.cluster_utils import Cluster

    from crashdrill.workers.ray_placement import NODE_HEALTH_CHECK

    cluster = Cluster(
        initialize_head=True,
        head_node_args=node_args(
            num_cpus=0, include_dashboard=False, _system_config=NODE_HEALTH_CHECK
        ),
    )
    for _ in range(nodes):
        cluster.add_node(**node_args())
    cluster.wait_for_nodes()
    return cluster


@contextmanager
def running_cluster(nodes: int = 2) -> Iterator[Any]:
    """start_cluster, then this process's Ray connection and the cluster shut down after
    (a module's fixture: `with running_cluster(nodes=3) as c: yield c`)."""
    import ray

    cluster = start_cluster(nodes)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def connect(cluster: Any) -> None:
    """This process's driver on `cluster`, in the lab's namespace (where its placement
    groups and actors are named): connected once, and again if it is connected to another
    cluster (a test checking actors in the wrong one would find none, and pass)."""
    import ray

    if ray.is_initialized():
        if ray.get_runtime_context().gcs_address == cluster.address:
            return
        ray.shutdown()
    ray.init(
        address=cluster.address,
        namespace="crashdrill",
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )


def worker_nodes(cluster: Any) -> list[Any]:
    return list(cluster.worker_nodes)


def node_of(cluster: Any, node_id: str) -> Any:
    """The cluster's node object with this Ray node id."""
    for node in cluster.worker_nodes:
        if node.node_id == node_id:
            return node
    raise LookupError(f"no worker node {node_id}")

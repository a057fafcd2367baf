"""Runs of two ranks on a Ray cluster on 127.0.0.1 (issue #35 §1): each run's ranks are
one placement group, packed on one node, and a lost node moves the group to another at
the same world size, from the mirror. One cluster for the module: a head that takes no
runs and three worker nodes of 2 CPUs (a pair of 2-rank runs fills two)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ray_cluster
from tests.support.extras import require_extra
from tests.support.lab import serving, wait_for_pair

require_extra("ray", module=True)
import ray  # noqa: E402 (after the skip: without the ray extra there is none)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster.running_cluster(nodes=3) as c:
        yield c


def group_nodes(run_dir: Path) -> set[str]:
    """The nodes of the bundles of the run's placement group (named in its ray.json)."""
    from ray.util.placement_group import get_placement_group, placement_group_table

    name = json.loads((run_dir / "ray.json").read_text())["placement_group"]
    table = placement_group_table(get_placement_group(name))
    assert table["strategy"] == "STRICT_PACK" and len(table["bundles"]) == 2
    return set(table["bundles_to_node_id"].values())


def test_a_lost_node_moves_a_two_rank_run_to_another_at_the_same_world_size(
    tmp_path: Path, cluster: Any
) -> None:
    from tests.integration.test_ray_lab import lab_on

    settings = lab_on(cluster, tmp_path)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        if not ray.is_initialized():  # the lab's driver is in another process: this one looks
            ray.init(
                address=cluster.address,
                namespace="crashdrill",  # the lab's: its placement groups are named there
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
            )
        created = client.post(
            "/api/pairs", json={"preset": "lesson-1.17", "overrides": {"steps": 600}}
        ).json()
        pair, run_b = created["pair"], created["runs"][1]["id"]
        run_dir = settings.data_dir / "runs" / run_b
        mirrored = tmp_path / "mirror" / run_b
        before = wait_for_pair(
            client,
            pair,
            lambda rs: (rs[1]["step"] or 0) >= 110 and any(mirrored.glob("step-*/MANIFEST.json")),
            "B past its mirrored checkpoint at step 100",
        )
        lost = before[1]["host"]
        assert group_nodes(run_dir) == {lost["node_id"]}  # both ranks' bundles on its node
        assert before[0]["host"]["node_id"] != lost["node_id"]  # A's group took another
        cluster.remove_node(ray_cluster.node_of(cluster, lost["node_id"]))
        moved = wait_for_pair(
            client,
            pair,
            lambda rs: rs[1]["segment"] == 1 and rs[1]["state"] == "running",
            "B training again",
        )
        new = moved[1]["host"]
        assert new["node_id"] != lost["node_id"]
        assert group_nodes(run_dir) == {new["node_id"]}  # a new group, both ranks there
        runs = wait_for_pair(
            client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
        )
        assert runs[1]["host"] == new and runs[1]["segment"] == 1
        events = client.get(f"/api/runs/{run_b}/events").json()["events"]
        event = next(e for e in events if e["code"] == "lost_host")
        assert (
            event["text"].startswith(f"Lost host {lost['name']} at step ")
            and f"; restarting its 2 ranks on host {new['name']} from the mirror's"
            in (event["text"])
        )
        [check] = client.get(f"/api/runs/{run_b}/resume-checks").json()["checks"]
        assert check["bit_identical"] is True and check["complete"]
        compared = {f["field"] for f in check["fields"] if f["equal"]}
        assert {"step.rank_loss_bits.0", "step.rank_loss_bits.1"} <= compared  # every rank's

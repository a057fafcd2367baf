"""Runs of two ranks on a Ray cluster on 127.0.0.1 (issue #35 §1): each run's ranks are
one placement group, packed on one node, and a lost node moves the group to another at
the same world size, from the mirror, or, where no node has room for the group any more,
on fewer ranks (a DCP checkpoint reshards, one file per rank is refused). One cluster for
the module: a head that takes no runs and three worker nodes of 2 CPUs (a pair of 2-rank
runs fills two); the second test adds 1-CPU nodes and removes the spare 2-CPU ones."""

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
        ray_cluster.connect(cluster)  # the lab's driver may be elsewhere: this one looks
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


def test_kill_one_rank_on_a_node_kills_it_there_and_the_crash_event_names_it(
    tmp_path: Path, cluster: Any
) -> None:
    """Crash mode `rank` (lesson 1.16's A) on a run whose group trains on a node: the card
    shows both ranks training (the launcher's ranks file, shipped to the server's copy),
    the node's actor kills the rank, the crash event says which and how fast its launcher
    noticed (from the shipped file), and the group restarts bit-identically."""
    from tests.integration.test_ray_lab import lab_on

    settings = lab_on(cluster, tmp_path)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post(
            "/api/pairs", json={"preset": "lesson-1.16", "overrides": {"steps": 300}}
        ).json()
        pair = created["pair"]
        run_a, run_b = (r["id"] for r in created["runs"])
        client.post(f"/api/runs/{run_b}/stop")
        wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["can_crash"] and (rs[0]["step"] or 0) >= 60,
            "A past step 60",
        )
        shown = client.get(f"/api/pairs/{pair}").json()["runs"][0]["ranks"]
        assert [r["state"] for r in shown] == ["training", "training"], shown
        r = client.post(f"/api/runs/{run_a}/crash", json={"crash_mode": "rank"})
        assert r.status_code == 202, r.text
        runs = wait_for_pair(client, pair, lambda rs: rs[0]["state"] == "finished", "A's end")
        assert runs[0]["segment"] == 1
        crash = next(
            e
            for e in client.get(f"/api/runs/{run_a}/events").json()["events"]
            if e["code"] == "crash"
        )
        killed = crash["fields"]["lost_rank"]
        assert crash["fields"]["crash_mode"] == "rank", crash
        assert f"Crash test: killed rank {killed} of 2 (pid " in crash["text"], crash["text"]
        assert "its launcher noticed in" in crash["text"], crash["text"]  # the shipped file's
        [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
        assert check["bit_identical"] is True and check["complete"], check


def test_with_no_node_left_that_has_room_for_two_ranks_dcp_reshards_onto_one_and_rank_files_refuse(
    tmp_path: Path, cluster: Any
) -> None:
    """Lesson 1.18's pair on the cluster with one free 1-CPU node: A's node is lost and no
    node has 2 CPUs free, so A restarts on 1 rank there (its DCP checkpoint of global data
    positions reshards, within the lesson's tolerance); then B's node is lost with a
    second 1-CPU node free, and B's checkpoint of one file per rank is refused by its
    restarted trainer: written by 2 ranks, this run has 1."""
    from tests.integration.test_ray_lab import lab_on

    settings = lab_on(cluster, tmp_path)
    small = cluster.add_node(**ray_cluster.node_args(num_cpus=1))
    cluster.wait_for_nodes()
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post(
            "/api/pairs", json={"preset": "lesson-1.18", "overrides": {"steps": 600}}
        ).json()
        pair = created["pair"]
        run_a, run_b = (r["id"] for r in created["runs"])
        mirrored = [tmp_path / "mirror" / run for run in (run_a, run_b)]
        before = wait_for_pair(
            client,
            pair,
            lambda rs: (
                all((r["step"] or 0) >= 110 for r in rs)
                and all(any(m.glob("step-*/MANIFEST.json")) for m in mirrored)
            ),
            "both past a mirrored checkpoint at step 100",
        )
        a_node, b_node = (r["host"]["node_id"] for r in before)
        # Only B's node (its 2 CPUs held) and the 1-CPU node stay beside A's.
        for node in ray_cluster.worker_nodes(cluster):
            if node.node_id not in {a_node, b_node, small.node_id}:
                cluster.remove_node(node)
        cluster.wait_for_nodes()  # the head has them dead before A's node goes
        cluster.remove_node(ray_cluster.node_of(cluster, a_node))
        moved = wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["segment"] == 1 and rs[0]["state"] == "running",
            "A training again",
        )
        assert moved[0]["host"]["node_id"] == small.node_id
        events = client.get(f"/api/runs/{run_a}/events").json()["events"]
        lost = next(e for e in events if e["code"] == "lost_host")
        assert (lost["fields"]["from_ranks"], lost["fields"]["ranks"]) == (2, 1), lost
        assert (
            "; restarting on 1 rank instead of 2 (no node left has room for 2) on host"
            in (lost["text"])
        ), lost["text"]
        # B, still training on its node: lost too, with a second 1-CPU node free.
        second = cluster.add_node(**ray_cluster.node_args(num_cpus=1))
        cluster.wait_for_nodes()
        cluster.remove_node(ray_cluster.node_of(cluster, b_node))
        runs = wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["state"] == "finished" and rs[1]["state"] == "failed",
            "A's end and B refusing",
        )
        assert runs[0]["segment"] == 1
        [check] = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
        assert check["complete"] and check["bit_identical"] is False
        assert check["resharded"]["within_tolerance"] is True, check["max_abs_delta"]
        assert runs[1]["host"]["node_id"] == second.node_id
        events = client.get(f"/api/runs/{run_b}/events").json()["events"]
        lost = next(e for e in events if e["code"] == "lost_host")
        assert (lost["fields"]["from_ranks"], lost["fields"]["ranks"]) == (2, 1), lost
        refused = next(e for e in events if e["code"] == "checkpoint_refused")
        assert "written by 2 ranks, this run has 1" in refused["text"], refused

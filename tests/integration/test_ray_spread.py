"""A run of two ranks spread over two nodes of a Ray cluster on 127.0.0.1 (issue #35 §1):
its placement group STRICT_SPREADs one bundle per node, each node's launcher starts its
rank and the process group is wired across the nodes. A rank crash kills rank 1 on its
node and the group resumes on the same nodes bit-identically. A lost node restarts the group on
the nodes left at the same world size, from the mirror, bit-identically; with one node
left, on one rank (lesson 1.18's A: a DCP checkpoint of global data positions reshards).
A server SIGKILLed under a spread run re-attaches to every node's actor. A cluster of its
own: a head that takes no runs and three worker nodes of 2 CPUs (the node losses last)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashdrill.trainer.presets import dump_preset, get_preset
from tests.support import ray_cluster
from tests.support.extras import require_extra
from tests.support.lab import free_port, serving, spawn_server, stop_server, wait_for_pair

require_extra("ray", module=True)
import ray  # noqa: E402 (after the skip: without the ray extra there is none)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster.running_cluster(nodes=3) as c:
        yield c


def group_table(run_dir: Path) -> dict[str, Any]:
    from ray.util.placement_group import get_placement_group, placement_group_table

    name = json.loads((run_dir / "ray.json").read_text())["placement_group"]
    return dict(placement_group_table(get_placement_group(name)))


def _events(client: httpx.Client, run: str) -> list[dict[str, Any]]:
    return list(client.get(f"/api/runs/{run}/events").json()["events"])


def _check(client: httpx.Client, run: str, index: int) -> dict[str, Any]:
    """The run's resume check `index`, once it is complete (the recomputed steps reached
    the step the group was lost at)."""
    deadline = time.monotonic() + 120
    checks: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        checks = client.get(f"/api/runs/{run}/resume-checks").json()["checks"]
        if len(checks) > index and checks[index]["complete"]:
            return dict(checks[index])
        time.sleep(0.5)
    said = [(e["code"], e["text"][:160]) for e in _events(client, run) if e["code"] != "evaluated"]
    brief = [{k: c[k] for k in ("segment", "from_step", "points", "expected_points")}
             for c in checks]  # fmt: skip
    raise AssertionError(f"no complete resume check of {run}: {brief}; events {said}")


def _spread_preset(presets: Path, steps: int, mode: str = "rank") -> str:
    """Lesson 1.18 with its ranks spread (its A: DCP of global data positions, which
    reshards), a crash test of `mode` on the same world size, `steps` steps."""
    lesson = get_preset("lesson-1.18")
    run = {**lesson.run, "placement": "spread", "steps": steps}
    crash = replace(lesson.crash, mode=mode, restart_ranks=0, window={})  # rank 1: the seed's
    spread = replace(lesson, id="spread-1.18", run=run, crash=crash)
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "spread-1.18.toml").write_text(dump_preset(spread))
    return spread.id


def test_a_server_killed_under_a_spread_run_re_attaches_to_every_node_s_actor(
    tmp_path: Path, cluster: Any
) -> None:
    """The server SIGKILLed while a spread group trains: the restarted server finds rank
    0's actor and the other node's (ray.json's `peers`), the run goes on in its segment,
    every step stored once, and its end releases both actors."""
    from tests.integration.test_ray_lab import lab_env

    data_dir, port, log = tmp_path / "lab", free_port(), tmp_path / "server.log"
    preset = _spread_preset(data_dir / "presets", 600)
    env = lab_env(cluster, tmp_path)
    server = spawn_server(port, env, log, start_timeout=120)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            created = client.post("/api/pairs", json={"preset": preset}).json()
            cookies = dict(client.cookies)
            pair, run_a = created["pair"], created["runs"][0]["id"]
            client.post(f"/api/runs/{created['runs'][1]['id']}/stop")
            wait_for_pair(client, pair, lambda rs: (rs[0]["step"] or 0) >= 80, "A at step 80")
        placed = json.loads((data_dir / "runs" / run_a / "ray.json").read_text())
        assert len(placed["peers"]) == 1
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(2)  # the group goes on training on its nodes meanwhile
        server = spawn_server(port, env, log, start_timeout=120)
        with httpx.Client(base_url=url, timeout=30, cookies=cookies) as client:
            runs = wait_for_pair(client, pair, lambda rs: rs[0]["state"] == "finished", "A's end")
            assert (runs[0]["segment"], runs[0]["step"]) == (0, 600)  # re-attached
            stored = client.get(f"/api/runs/{run_a}/records", params={"limit": 20000}).json()
            steps = [r["step"] for r in stored["records"] if r["kind"] == "step"]
            assert sorted(steps) == list(range(1, 601)), "a step lost or repeated"
        ray_cluster.connect(cluster)  # the lab's driver may be elsewhere: this one looks
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # released: both actors gone
            try:
                ray.get_actor(placed["peers"][0], namespace="crashdrill")
            except ValueError:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the peer actor {placed['peers'][0]} outlived its run")
    finally:
        stop_server(server)


def test_a_spread_group_survives_a_lost_node_then_restarts_on_one_rank_when_one_is_left(
    tmp_path: Path, cluster: Any
) -> None:
    from tests.integration.test_ray_lab import lab_on

    settings = lab_on(cluster, tmp_path)
    _spread_preset(settings.instructor_presets_dir, 3000)  # minutes, not seconds
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        ray_cluster.connect(cluster)  # the lab's driver may be elsewhere: this one looks
        created = client.post(
            "/api/pairs",
            json={"preset": "spread-1.18"},
        ).json()
        assert "pair" in created, created
        pair = created["pair"]
        run_a, run_b = (r["id"] for r in created["runs"])
        client.post(f"/api/runs/{run_b}/stop")  # one group on the cluster: A's
        run_dir = settings.data_dir / "runs" / run_a
        mirrored = tmp_path / "mirror" / run_a
        wait_for_pair(
            client,
            pair,
            lambda rs: (rs[0]["step"] or 0) >= 110 and any(mirrored.glob("step-*/MANIFEST.json")),
            "A past its mirrored checkpoint at step 100",
        )
        table = group_table(run_dir)
        nodes = [table["bundles_to_node_id"][k] for k in range(2)]
        assert table["strategy"] == "STRICT_SPREAD" and len(set(nodes)) == 2, table
        placed = json.loads((run_dir / "ray.json").read_text())
        assert len(placed["peers"]) == 1  # rank 1's node has an actor of the run too
        # A rank crash kills rank 1 on its node (the peer's actor kills it there); the
        # group ends and restarts on the same nodes, from their own disks.
        r = client.post(f"/api/runs/{run_a}/crash", json={"crash_mode": "rank"})
        assert r.status_code == 202, r.text
        wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["segment"] == 1 and (rs[0]["step"] or 0) >= 220,
            "A past step 220 after its rank crash",
        )
        crashed = next(e for e in _events(client, run_a) if e["code"] == "crash")
        assert crashed["fields"]["lost_rank"] == 1, crashed
        assert "Crash test: killed rank 1 of 2 (pid " in crashed["text"], crashed["text"]
        assert _check(client, run_a, 0)["bit_identical"] is True
        assert group_table(run_dir)["bundles_to_node_id"][1] == nodes[1]  # not moved
        # Rank 1's node is lost: not the node whose launcher writes the run's records.
        cluster.remove_node(ray_cluster.node_of(cluster, nodes[1]))
        moved = wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["segment"] == 2 and rs[0]["state"] == "running",
            "A training again on two nodes",
        )
        again = [group_table(run_dir)["bundles_to_node_id"][k] for k in range(2)]
        assert nodes[1] not in again and len(set(again)) == 2, again
        lost = next(e for e in _events(client, run_a) if e["code"] == "lost_host")
        assert "; restarting its 2 ranks on host" in lost["text"], lost["text"]
        assert lost["fields"].get("from_ranks") in (None, 2), lost
        check = _check(client, run_a, 1)
        assert check["bit_identical"] is True, check
        compared = {f["field"] for f in check["fields"] if f["equal"]}
        assert {"step.rank_loss_bits.0", "step.rank_loss_bits.1"} <= compared
        # Down to one node: the group restarts on one rank there, resharded. Removed a few
        # steps past a checkpoint, so that steps are lost and the resharded resume has
        # losses to compare (a loss right at a checkpoint leaves nothing: seen in CI).
        every = int(get_preset("lesson-1.18").run["ckpt_every"])
        wait_for_pair(
            client,
            pair,
            lambda rs: 5 <= (rs[0]["step"] or 0) % every <= every // 2,
            "A a few steps past a checkpoint",
        )
        cluster.remove_node(ray_cluster.node_of(cluster, again[1]))
        runs = wait_for_pair(
            client, pair, lambda rs: rs[0]["state"] in ("finished", "failed"), "A's end"
        )
        assert runs[0]["state"] == "finished" and runs[0]["segment"] == 3, runs[0]
        assert runs[0]["host"]["node_id"] == moved[0]["host"]["node_id"]  # rank 0's node
        fewer = [e for e in _events(client, run_a) if e["code"] == "lost_host"][-1]
        assert (fewer["fields"]["from_ranks"], fewer["fields"]["ranks"]) == (2, 1), fewer
        last = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"][-1]
        assert (last["resharded"]["from_ranks"], last["resharded"]["ranks"]) == (2, 1), last
        if last["expected_points"]:  # steps were lost: recomputed on one rank, compared
            assert last["resharded"]["within_tolerance"] is True, last
        else:  # the loss landed on a checkpoint step after all (a very slow machine)
            assert last["outcome"] == "nothing_left", last

"""The lab served with --ray on a cluster on 127.0.0.1: a pair's runs train on the
cluster's nodes, a crash test resumes bit-identically, and a server killed with SIGKILL
re-attaches to the runs' actors without losing or repeating a record. One cluster for
the module (a head that takes no runs, two worker nodes)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ray_cluster
from tests.support.executor_contract import ExecutorContract
from tests.support.extras import require_extra
from tests.support.lab import crash_costing_steps, free_port, serving, spawn_server, wait_for_pair

require_extra("ray", module=True)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster.running_cluster(nodes=2) as c:
        yield c


class TestRayExecutorContract(ExecutorContract):
    """The executor contract (tests/support/executor_contract.py, which the local executor
    passes in test_executor_conformance.py) on this module's cluster: placed, shipped,
    killed and adopted through each run's actor."""

    @pytest.fixture(autouse=True)
    def _on(self, cluster: Any, tmp_path: Path) -> None:
        self.address, self.mirror = cluster.address, str(tmp_path / "mirror")

    def make_executor(self) -> Any:
        from crashdrill.workers.ray_executor import RayExecutor

        return RayExecutor.connect(self.address, self.mirror)


def node_ids(cluster: Any) -> set[str]:
    return {n.node_id for n in ray_cluster.worker_nodes(cluster)}


def lab_on(cluster: Any, tmp_path: Path) -> Any:
    """Settings of a lab whose runs go to `cluster`, its mirror a shared directory."""
    from crashdrill.server.settings import Settings

    return Settings(
        data_dir=tmp_path / "lab",
        port=free_port(),
        stop_runs_on_exit=True,
        telemetry=False,
        executor="ray",
        ray_address=cluster.address,
        mirror=str(tmp_path / "mirror"),
    )


def test_a_pair_on_the_cluster_is_crash_tested_and_resumes_bit_identically(
    tmp_path: Path, cluster: Any
) -> None:
    """With a student's setting, so the runs train a frozen preset: each node trains its
    own copy of it, never a path under the server's data dir (a node on another machine
    cannot read that)."""
    settings = dataclasses.replace(lab_on(cluster, tmp_path), telemetry=True)  # nodes sample
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post(
            "/api/pairs", json={"preset": "quick", "overrides": {"steps": 240}}
        ).json()
        pair = created["pair"]
        run_a = created["runs"][0]["id"]
        runs = wait_for_pair(
            client,
            pair,
            lambda rs: rs[0]["stage"] == "train" and (rs[0]["step"] or 0) >= 60,
            "A past its first checkpoint",
        )
        assert all(r["host"]["node_id"] in node_ids(cluster) for r in runs)
        hosts = {r["host"]["node_id"]: r["host"]["name"] for r in runs}
        assert_telemetry_names_the_nodes(client, pair, hosts)
        assert not (tmp_path / "lab" / "runs" / run_a / "ckpt").exists()  # on the node
        trained = trained_preset(run_a)
        assert trained.name == "preset.toml" and trained.is_file(), trained
        assert not trained.is_relative_to(tmp_path / "lab"), f"the server's copy: {trained}"
        # forked from the node actor's warm process, not exec'd (no `import torch` per start)
        assert "crashdrill.processes.forkserver" in trainer_parent(run_a)
        _, segment = crash_costing_steps(client, pair, 0, 60)
        runs = wait_for_pair(
            client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
        )
        assert [(r["segment"], r["step"]) for r in runs] == [(segment, 240), (0, 240)]
        checks = client.get(f"/api/runs/{run_a}/resume-checks").json()["checks"]
        (check,) = [c for c in checks if c["segment"] == segment]
        assert check["bit_identical"] is True and check["points"] > 0


def assert_telemetry_names_the_nodes(
    client: httpx.Client, pair: str, hosts: dict[str, str]
) -> None:
    """Each node a run trains on sampled itself, and the pair's telemetry (its stream's
    hello, /api/machine?pair=) is those nodes' samples, labelled by their names."""
    deadline = time.monotonic() + 30
    while True:
        machine = client.get("/api/machine", params={"pair": pair}).json()
        named = {s["node"]["node_id"]: s["node"]["name"] for s in machine["nodes"]}
        if named == hosts or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert named == hosts, machine["nodes"]
    assert all(s["kind"] == "telemetry" and s["ram_total_bytes"] > 0 for s in machine["nodes"])
    assert machine["cluster"]["kind"] == "ray" and machine["cluster"]["reachable"] is True
    with client.stream("GET", "/api/stream", params={"pair": pair}) as stream:
        hello = next(line for line in stream.iter_lines() if line.startswith("data:"))
    pushed = json.loads(hello.removeprefix("data:"))
    assert {s["node"]["node_id"]: s["node"]["name"] for s in pushed["nodes"]} == hosts
    health = client.get("/api/health").json()["cluster"]
    assert health["kind"] == "ray" and health["reachable"] is True and health["error"] is None


def trained_preset(run_id: str) -> Path:
    """The preset argument of the live trainer of `run_id` (its command line: --run-dir
    names the node's copy of the run dir)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--run-dir" in cmd and Path(cmd[cmd.index("--run-dir") + 1]).name == run_id:
            return Path(cmd[cmd.index("--run-dir") - 1])
    raise AssertionError(f"no live trainer of run {run_id}")


def trainer_parent(run_id: str) -> str:
    """The command line of the live trainer's parent process."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--run-dir" in cmd and Path(cmd[cmd.index("--run-dir") + 1]).name == run_id:
            return " ".join(a for a in proc.parent().cmdline() if a.strip())
    raise AssertionError(f"no live trainer of run {run_id}")


def file_records(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for name in ("records.jsonl", "mirror.jsonl"):
        path = run_dir / name
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def lab_env(cluster: Any, tmp_path: Path) -> dict[str, str]:
    """The environment of a lab server subprocess whose runs go to `cluster` (what
    `lab_on` is for one started in this process): data dir tmp_path/lab, a shared mirror."""
    return {
        **os.environ,
        "CRASHDRILL_DATA_DIR": str(tmp_path / "lab"),
        "CRASHDRILL_TELEMETRY": "0",
        "CRASHDRILL_RAY_ADDRESS": cluster.address,
        "CRASHDRILL_MIRROR": str(tmp_path / "mirror"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def test_a_server_killed_mid_run_re_attaches_to_the_actors_and_loses_no_record(
    tmp_path: Path, cluster: Any
) -> None:
    data_dir, port, log = tmp_path / "lab", free_port(), tmp_path / "server.log"
    env = lab_env(cluster, tmp_path)
    server = spawn_server(port, env, log, start_timeout=120)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            created = client.post("/api/pairs", json={"preset": "quick"}).json()
            cookies = dict(client.cookies)
            pair = created["pair"]
            wait_for_pair(
                client, pair, lambda rs: all((r["step"] or 0) >= 80 for r in rs), "step 80"
            )
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(2)  # the trainers go on training on their nodes meanwhile
        server = spawn_server(port, env, log, start_timeout=120)
        with httpx.Client(base_url=url, timeout=30, cookies=cookies) as client:
            runs = client.get(f"/api/pairs/{pair}").json()["runs"]
            assert [r["segment"] for r in runs] == [0, 0]  # re-attached, not restarted
            runs = wait_for_pair(
                client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
            )
            assert [(r["segment"], r["step"]) for r in runs] == [(0, 300), (0, 300)]
            for run in (r["id"] for r in runs):
                stored = client.get(f"/api/runs/{run}/records", params={"limit": 20000}).json()
                in_file = file_records(data_dir / "runs" / run)
                key = ("kind", "segment", "step", "t")
                counted = Counter(tuple(r.get(k) for k in key) for r in stored["records"])
                counted.subtract(Counter(tuple(r.get(k) for k in key) for r in in_file))
                assert {k: n for k, n in counted.items() if n} == {}
                steps = [r["step"] for r in stored["records"] if r["kind"] == "step"]
                assert sorted(steps) == list(range(1, 301)), "a step lost or repeated"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_lesson_1_15_on_the_cluster_moves_both_runs_and_only_the_mirrored_one_resumes(
    tmp_path: Path, cluster: Any
) -> None:
    settings = lab_on(cluster, tmp_path)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/pairs", json={"preset": "lesson-1.15"}).json()
        pair = created["pair"]
        run_a, run_b = (r["id"] for r in created["runs"])
        mirrored = tmp_path / "mirror" / run_b
        before = wait_for_pair(
            client,
            pair,
            lambda rs: (
                all(r["can_crash"] and (r["step"] or 0) >= 150 for r in rs)
                and any(mirrored.glob("step-*/MANIFEST.json"))
            ),
            "both past step 150 with B's checkpoint mirrored",
        )
        for run in (run_a, run_b):
            r = client.post(f"/api/runs/{run}/crash")
            assert r.status_code == 202 and r.json()["crash_mode"] == "host", r.text
        runs = wait_for_pair(
            client,
            pair,
            lambda rs: all(r["state"] in ("finished", "failed") for r in rs),
            "both runs to end",
        )
        assert [r["state"] for r in runs] == ["failed", "finished"]
        assert runs[0]["exit_code"] == 3
        for old, new in zip(before, runs, strict=True):
            assert new["host"]["node_id"] != old["host"]["node_id"]  # moved to the other node
        events = client.get(f"/api/runs/{run_b}/events").json()["events"]
        moved = next(e for e in events if e["code"] == "crash")
        assert moved["text"].startswith(f"Crash test: lost host {before[1]['host']['name']}")
        assert (
            f"restarting on host {runs[1]['host']['name']} from the mirror's checkpoint"
            in moved["text"]
        )
        [check] = client.get(f"/api/runs/{run_b}/resume-checks").json()["checks"]
        assert check["bit_identical"] is True and check["complete"]
        events_a = client.get(f"/api/runs/{run_a}/events").json()["events"]
        assert (
            "the mirror holds no checkpoint"
            in next(e for e in events_a if e["code"] == "crash")["text"]
        )


def test_the_node_running_b_is_removed_and_b_resumes_on_another_from_the_mirror(
    tmp_path: Path, cluster: Any
) -> None:
    """Last in the module: it takes a node away for good."""
    settings = lab_on(cluster, tmp_path)
    with serving(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        created = client.post("/api/pairs", json={"preset": "quick"}).json()
        pair = created["pair"]
        run_b = created["runs"][1]["id"]
        mirrored = tmp_path / "mirror" / run_b
        before = wait_for_pair(
            client,
            pair,
            lambda rs: (rs[1]["step"] or 0) >= 160 and any(mirrored.glob("step-*/MANIFEST.json")),
            "B past its mirrored checkpoint at step 150",
        )
        lost = before[1]["host"]
        cluster.remove_node(ray_cluster.node_of(cluster, lost["node_id"]))
        runs = wait_for_pair(
            client, pair, lambda rs: all(r["state"] == "finished" for r in rs), "the end"
        )
        new = runs[1]["host"]
        assert new["node_id"] != lost["node_id"] and runs[1]["segment"] == 1
        events = client.get(f"/api/runs/{run_b}/events").json()["events"]
        event = next(e for e in events if e["code"] == "lost_host")
        records = client.get(
            f"/api/runs/{run_b}/records", params={"kind": "event", "limit": 1000}
        ).json()["records"]
        data = next(r for r in records if r.get("code") == "lost_host")
        n, m = data["at_step"], data["resume_from"]
        back = f", {n - m} step{'' if n - m == 1 else 's'} back" if n > m else ""
        assert event["text"] == (
            f"Lost host {lost['name']} at step {n}; restarting on host {new['name']} from the"
            f" mirror's checkpoint at step {m}{back}."
        )
        [check] = client.get(f"/api/runs/{run_b}/resume-checks").json()["checks"]
        assert check["from_step"] == m and check["bit_identical"] is True and check["complete"]


def test_a_run_no_node_can_take_waits_saying_so_and_a_node_that_joins_takes_it(
    tmp_path: Path, cluster: Any
) -> None:
    """A CUDA preset on a cluster without GPUs: its placement waits with the reason in the
    run's log, and a GPU node that joins takes it (Ray counts a declared GPU)."""
    import threading

    from crashdrill.trainer.presets import dump_preset, get_preset
    from crashdrill.workers.executor import StartCancelled
    from crashdrill.workers.launch import Launch
    from crashdrill.workers.ray_executor import RayExecutor
    from crashdrill.workers.run_dir import RunDir

    executor = RayExecutor.connect(cluster.address, mirror=str(tmp_path / "mirror"))
    preset = tmp_path / "gpu.toml"
    text = dump_preset(get_preset("quick")).replace("threads = 1", 'threads = 1\ndevice = "cuda"')
    preset.write_text(text)
    run_dir = tmp_path / "runs" / "gpu-run"
    executor.prepare(Launch(run_dir, str(preset), "A"))
    found: dict[str, Any] = {}
    files = executor.files(run_dir)
    placing = threading.Thread(target=lambda: found.update(step=files.checkpoint_step()))
    placing.start()
    deadline = time.monotonic() + 60
    while not any(r.get("code") == "waiting_for_node" for r in RunDir(run_dir).tail_records()):
        assert time.monotonic() < deadline and placing.is_alive(), "no waiting event"
        time.sleep(0.2)
    [waiting] = [r for r in RunDir(run_dir).tail_records() if r.get("code")]
    assert waiting["text"].startswith("Waiting for a node of the Ray cluster with 1 GPU free")

    # A second one is stopped while it waits: its start gives up at once, no node taken.
    stopped_dir = tmp_path / "runs" / "gpu-stopped"
    stopped = Launch(stopped_dir, str(preset), "A")
    outcome: dict[str, Any] = {}

    def start_stopped() -> None:
        try:
            executor.start(stopped, {}, require_checkpoint=False)
        except StartCancelled as e:
            outcome["cancelled"] = str(e)

    starting = threading.Thread(target=start_stopped)
    starting.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    executor.cancel(stopped_dir)
    starting.join(10)
    assert not starting.is_alive() and "stopped while it waited" in outcome["cancelled"]
    assert time.monotonic() - t0 < 3
    assert executor.host(stopped_dir) is None
    node = cluster.add_node(**ray_cluster.node_args(num_cpus=1, num_gpus=1))
    placing.join(120)
    assert not placing.is_alive() and found == {"step": None}
    host = executor.host(run_dir)
    assert host is not None and host.node_id == node.node_id
    executor.release(run_dir)

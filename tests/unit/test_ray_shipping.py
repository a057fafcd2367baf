"""The pieces of the Ray executor that need no cluster: what a poll ships, where a run is
placed, and which addresses a TCP check can try."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashdrill.trainer.presets import dump_preset, get_preset
from crashdrill.workers.ray_node import complete_lines
from crashdrill.workers.ray_placement import Resources
from tests.support.extras import require_extra


def test_a_poll_ships_complete_lines_only_from_the_server_s_offset(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')  # a line still being written
    assert complete_lines(path, 0) == b'{"a":1}\n{"b":2}\n'
    assert complete_lines(path, 8) == b'{"b":2}\n'
    assert complete_lines(path, 16) == b""  # only the torn line: nothing yet
    assert complete_lines(path, 0, limit=10) == b'{"a":1}\n'  # a chunk ends at a line
    assert complete_lines(tmp_path / "missing.jsonl", 0) == b""


def test_a_checkpoint_record_written_between_two_polls_reaches_the_server_at_the_next(
    tmp_path: Path,
) -> None:
    """The server's copy of records.jsonl is the node's, up to its last complete line,
    after every poll: a checkpoint record the trainer appends mid-interval is shipped by
    the next poll, not held back, and a line being written goes with the poll after."""
    require_extra("ray")
    from crashdrill.workers.ray_executor import RayExecutor
    from crashdrill.workers.ray_node import NodeRun
    from crashdrill.workers.run_dir import RunDir

    node = NodeRun.__new__(NodeRun)  # its state without a cluster: no trainer, no sampler
    node.run_dir, node.proc, node.code = RunDir(tmp_path / "node"), None, None
    node.run_dir.path.mkdir()
    server = tmp_path / "server"
    server.mkdir()
    executor = RayExecutor(mirror=str(tmp_path / "mirror"))
    executor.cluster.telemetry = None
    executor._call = lambda actor, method, *args: getattr(actor, method)(*args)  # type: ignore[method-assign]

    written = node.run_dir.records
    with open(written, "ab", buffering=0) as trainer:
        trainer.write(b'{"kind":"step","step":149}\n{"kind":"step","step":150}\n')
        executor.ship(server, node)
        trainer.write(b'{"kind":"ckpt","step":150}\n{"kind":"step","st')  # mid-interval
        executor.ship(server, node)
        assert (server / "records.jsonl").read_bytes().endswith(b'{"kind":"ckpt","step":150}\n')
        trainer.write(b'ep":151}\n')
        executor.ship(server, node)
    assert (server / "records.jsonl").read_bytes() == written.read_bytes()


def test_a_cuda_run_asks_for_a_gpu_and_a_cpu_run_for_its_threads(tmp_path: Path) -> None:
    """quick is on device "auto": a GPU when the cluster has one."""
    resources = Resources
    assert resources.of_preset("quick") == resources(num_cpus=1, num_gpus=0)
    text = dump_preset(get_preset("quick"))
    cuda = tmp_path / "cuda.toml"
    cuda.write_text(text.replace("threads = 1", 'threads = 1\ndevice = "cuda"'))
    assert resources.of_preset(str(cuda)) == resources(num_cpus=1, num_gpus=1)
    assert resources.of_preset("quick", "B", gpus=True) == resources(num_cpus=1, num_gpus=1)
    four = tmp_path / "four.toml"
    four.write_text(text.replace("threads = 1", "threads = 4"))
    assert resources.of_preset(str(four)) == resources(num_cpus=4, num_gpus=0)


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("ray://head.example:10001", ("head.example", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
    ],
)
def test_the_reachability_check_tries_the_address_s_host_and_port(
    address: str, target: tuple[str, int] | None
) -> None:
    require_extra("ray")
    from crashdrill.workers import ray_executor

    assert ray_executor.host_and_port(address) == target


class _Context:
    """What ray.get_runtime_context() answers, for a driver connected before the lab."""

    def __init__(self, gcs_address: str, namespace: str) -> None:
        self.gcs_address = gcs_address
        self.namespace = namespace


@pytest.mark.parametrize(
    ("connected", "namespace", "address", "refusal"),
    [
        ("127.0.0.1:6379", "crashdrill", "127.0.0.1:6379", None),
        ("127.0.0.1:6379", "crashdrill", "localhost:6379", None),  # one loopback
        ("127.0.0.1:6379", "crashdrill", "auto", None),
        ("127.0.0.1:6379", "crashdrill", "ray://head.example:10001", None),
        ("127.0.0.1:6379", "crashdrill", "127.0.0.1:6380", "at 127.0.0.1:6379, not 127.0.0.1:6380"),
        ("10.0.0.5:6379", "crashdrill", "10.0.0.6:6379", "at 10.0.0.5:6379, not 10.0.0.6:6379"),
        ("127.0.0.1:6379", "other", "127.0.0.1:6379", "namespace 'other'"),
    ],
)
def test_a_driver_connected_before_the_lab_must_be_on_the_named_cluster_and_namespace(
    monkeypatch: pytest.MonkeyPatch,
    connected: str,
    namespace: str,
    address: str,
    refusal: str | None,
) -> None:
    """The lab keeps a connection it finds only when it is to the cluster it was given,
    in its namespace: else its actors would go to a cluster nobody named, or be looked
    for where they are not."""
    require_extra("ray")
    from crashdrill.workers import ray_executor
    from crashdrill.workers.executor import ExecutorError

    context = _Context(connected, namespace)
    monkeypatch.setattr(ray_executor.ray, "get_runtime_context", lambda: context)
    if refusal is None:
        ray_executor.check_connected_to(address)
        return
    with pytest.raises(ExecutorError, match=refusal.replace(".", r"\.")):
        ray_executor.check_connected_to(address)

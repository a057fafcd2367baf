"""A Ray node's own telemetry (workers/node_telemetry.py): one sampler per node however
many run actors poll there, at most one sample per interval. Fakes stand in for psutil
and NVML, and two NodeTelemetry objects on one root stand in for two actors on one node
(an flock is held per open file, so they exclude each other as two processes would)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crashdrill.workers.executor import Host
from crashdrill.workers.node_telemetry import LATEST, NodeTelemetry

NODE = Host("abcdef0123456789", "box/abcdef01")


class FakeSample:
    def __init__(self, n: int) -> None:
        self.n = n

    def to_record(self) -> dict[str, Any]:
        return {"v": 1, "kind": "telemetry", "t": 1000.0 + self.n, "cpu_pct": 50.0}


class FakeSampler:
    made = 0

    def __init__(self, price_per_kwh: float, rent_per_hour: float) -> None:
        FakeSampler.made += 1
        self.taken = 0
        self.closed = False

    def sample(self) -> FakeSample:
        self.taken += 1
        return FakeSample(self.taken)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def actor(root: Path, clock: Clock) -> NodeTelemetry:
    return NodeTelemetry(root, NODE, sampler_factory=FakeSampler, clock=clock)


def test_two_actors_on_one_node_send_one_sample_per_interval_between_them(
    tmp_path: Path,
) -> None:
    clock = Clock()
    first, second = actor(tmp_path, clock), actor(tmp_path, clock)
    sent = []
    for tick in range(10):  # both poll every 0.5 s for 5 s; the interval is 2 s
        clock.now = tick * 0.5
        for a in (first, second):
            record = a.due(interval_s=2.0)
            if record is not None:
                sent.append((clock.now, record))
    assert [t for t, _ in sent] == [0.0, 2.0, 4.0]
    assert all(r["node"] == NODE.to_dict() and r["kind"] == "telemetry" for _, r in sent)
    assert first._sampler is not None and second._sampler is None  # one sampler per node
    latest = json.loads((tmp_path / LATEST).read_text())
    assert latest == sent[-1][1]  # the node's newest sample, for whoever reads it there


def test_when_the_sampling_actor_ends_another_on_the_node_takes_over(tmp_path: Path) -> None:
    clock = Clock()
    first, second = actor(tmp_path, clock), actor(tmp_path, clock)
    assert first.due(2.0) is not None and second.due(2.0) is None
    sampler = first._sampler
    first.close()  # its run ended: the actor goes
    assert sampler.closed
    clock.now = 0.5
    assert second.due(2.0) is not None  # the lock is free: this one samples now
    assert second.due(2.0) is None  # and keeps to the interval itself


def test_a_node_whose_sampler_cannot_start_stays_quiet_instead_of_failing_the_poll(
    tmp_path: Path,
) -> None:
    def broken(_price: float, _rent: float) -> Any:
        raise ImportError("no psutil on this node")

    node = NodeTelemetry(tmp_path, NODE, sampler_factory=broken, clock=Clock())
    assert node.due(2.0) is None
    assert node.due(2.0) is None

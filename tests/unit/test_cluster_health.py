"""Whether the cluster answers (workers/cluster_health.py), how the Ray executor tells it
(fakes for ray.get: no cluster), and which nodes' telemetry a pair's streams get
(server/stream/telemetry_feed.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crashdrill.server.cluster import cluster_status
from crashdrill.server.stream.fanout import Message
from crashdrill.server.stream.telemetry_feed import MACHINE_CHANNEL, TelemetryFeed, pair_nodes
from crashdrill.workers.cluster_health import ClusterHealth, ClusterNodes
from crashdrill.workers.local_executor import LocalExecutor
from tests.support.extras import require_extra


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cluster_is_unreachable_from_its_first_failed_call_until_one_answers() -> None:
    clock = Clock()
    changes: list[dict[str, Any]] = []
    health = ClusterHealth("ray", "head:6379", on_change=changes.append, clock=clock)
    health.ok()
    assert health.status()["reachable"] is True and health.status()["last_ok"] == 1000.0
    clock.now = 1010.0
    health.failed("GetTimeoutError: Get timed out")
    clock.now = 1040.0
    health.failed("ActorUnavailableError: the actor is unavailable")
    status = health.status()
    assert status == {
        "kind": "ray",
        "address": "head:6379",
        "reachable": False,
        "since": 1010.0,  # when the outage began, not the newest failure
        "last_ok": 1000.0,
        "error": "ActorUnavailableError: the actor is unavailable",
    }
    clock.now = 1050.0
    health.ok()
    health.ok()
    assert health.status()["reachable"] is True and health.status()["since"] is None
    assert health.status()["error"] is None
    # One change when it was lost, one when it came back: not one per call.
    assert [(c["reachable"], c["since"]) for c in changes] == [(False, 1010.0), (True, None)]


def test_the_local_executor_is_always_reachable() -> None:
    assert cluster_status(LocalExecutor()) == {
        "kind": "local",
        "address": None,
        "reachable": True,
        "since": None,
        "last_ok": None,
        "error": None,
    }


def test_a_ray_call_that_times_out_marks_the_cluster_unreachable_and_one_that_answers_clears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_extra("ray")
    from crashdrill.workers import ray_executor

    executor = ray_executor.RayExecutor("/mirror", "head:6379")

    class Method:
        def remote(self, *args: Any) -> tuple[Any, ...]:
            return args

    class Actor:
        poll = Method()

    def timed_out(_ref: Any, timeout: float) -> Any:
        raise ray_executor.GetTimeoutError("Get timed out: some object(s) not ready.")

    monkeypatch.setattr(ray_executor.ray, "get", timed_out)
    with pytest.raises(ray_executor.GetTimeoutError):
        executor._call(Actor(), "poll", {})
    status = executor.cluster.health.status()
    assert status["reachable"] is False and "GetTimeoutError" in status["error"]
    monkeypatch.setattr(ray_executor.ray, "get", lambda ref, timeout: {"running": True})
    assert executor._call(Actor(), "poll", {}) == {"running": True}
    assert executor.cluster.health.status()["reachable"] is True


def test_the_cluster_keeps_each_node_s_newest_sample_and_tells_the_server_once() -> None:
    cluster = ClusterNodes("ray", "head:6379", runs_on=lambda node_id: [])
    told: list[dict[str, Any]] = []
    cluster.on_node_sample = told.append
    node = {"node_id": "n1", "name": "box/n1"}
    cluster.took_sample({"t": 2.0, "node": node})
    cluster.took_sample({"t": 2.0, "node": node})  # the same sample again: not news
    cluster.took_sample({"t": 1.0, "node": node})  # an older one, late
    cluster.took_sample(None)  # no sample due in that poll
    assert cluster.node_samples == {"n1": {"t": 2.0, "node": node}}
    assert told == [{"t": 2.0, "node": node}]


def sample(node_id: str, t: float) -> dict[str, Any]:
    return {"kind": "telemetry", "t": t, "node": {"node_id": node_id, "name": f"box/{node_id}"}}


def test_a_pair_gets_the_samples_of_the_nodes_its_runs_are_on_each_once() -> None:
    samples = {"n1": sample("n1", 1.0), "n2": sample("n2", 2.0), "n3": sample("n3", 3.0)}
    both_on_n2: list[dict[str, Any]] = [{"host": {"node_id": "n2"}}, {"host": {"node_id": "n2"}}]
    assert pair_nodes(both_on_n2, samples) == [samples["n2"]]
    apart = [{"host": {"node_id": "n3"}}, {"host": {"node_id": "n1"}}]
    assert pair_nodes(apart, samples) == [samples["n3"], samples["n1"]]
    queued: list[dict[str, Any]] = [
        {"host": None},
        {"host": {"node_id": "n9"}},
    ]  # queued; a node not sampled yet
    assert pair_nodes(queued, samples) == []


class Fanout:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def publish(self, channel: str, message: Message) -> None:
        self.sent.append((channel, message))


def feed_with(fanout: Fanout) -> TelemetryFeed:
    return TelemetryFeed(settings=None, store=None, fanout=fanout)  # type: ignore[arg-type]


def test_a_node_s_sample_goes_only_to_the_runs_on_that_node() -> None:
    fanout = Fanout()
    feed = feed_with(fanout)
    feed.runs_on = {"n1": ["run-a", "run-b"], "n2": ["run-c"]}.get  # type: ignore[assignment]
    feed._publish_node(sample("n1", 5.0))
    assert [channel for channel, _ in fanout.sent] == ["run:run-a", "run:run-b"]
    message = fanout.sent[0][1]
    assert (message.event, message.key) == ("telemetry", "node:n1")
    assert json.loads(message.data)["node"]["name"] == "box/n1"
    assert feed.for_pair([{"host": {"node_id": "n1"}}]) == [sample("n1", 5.0)]


def test_a_change_of_reachability_goes_to_every_stream_as_a_telemetry_message() -> None:
    fanout = Fanout()
    feed = feed_with(fanout)
    status = {"kind": "ray", "address": "head:6379", "reachable": False, "since": 9.0}
    feed._publish_cluster(status)
    [(channel, message)] = fanout.sent
    assert channel == MACHINE_CHANNEL
    assert (message.event, message.key) == ("telemetry", "cluster")
    assert json.loads(message.data) == {"cluster": status}

"""The lab on a 3-node Ray cluster on this machine against the local executor.

    python benchmarks/ray_cluster.py                 # both executors, 3 quick pairs each
    python benchmarks/ray_cluster.py --executors ray --pairs 2
    python benchmarks/ray_cluster.py --smoke         # CI size: 1 pair, local executor only
    python benchmarks/ray_cluster.py --smoke --executors ray    # the Ray part: 2 nodes
    python benchmarks/ray_cluster.py --executors ray --pairs 1 --preset lesson-1.16  # 2 ranks
    python benchmarks/ray_cluster.py --executors ray --pairs 1 --preset lesson-1.16 \
        --placement spread                           # 2 ranks on 2 nodes, rank 0's node lost

For each executor a fresh server subprocess (`python -m crashdrill.server`, telemetry off,
`--max-concurrent` = 2 × pairs) and the same load: `--pairs` pairs of `quick` (or
`--preset lesson-1.16`: runs of 2 ranks, crash mode kill) with
steps = `--steps` (a student's override, so the runs are still training when the crash
and the host loss come; 6 runs by default, the real trainer). For Ray, a cluster on
127.0.0.1 started here with ray.cluster_utils.Cluster (a head with no CPUs, `--nodes`
worker nodes of 2 CPUs) and a mirror directory. It measures, for one run each:
- record written → visible in GET /api/runs/{run}/records: polled every 20 ms, per step
  record the time it was first seen minus the `t` the trainer wrote (p50/p99);
- crash → first recomputed step: from POST …/crash to the `t` of the first step record
  of the next segment;
- host lost → first recomputed step on the new node (Ray only), once every node's standby
  is warm (what a node lost minutes into a run finds; the wait is printed): from
  remove_node of the run's node to the `t` of its next segment's first step, and its
  parts (HOST_LOSS_PARTS:
  until the head declares the node dead, seen by this process as a Ray driver; until the
  supervisor noticed and until the new placement was up, the `lost_host` event's
  `noticed_t` and `placed_t`; until that event, the new trainer's `resumed` event and its
  first step);
- the server's CPU (100 % = one core) over `--cpu-window-s` once every run trains;
- checkpoint record written → visible in the same API (p50/max), a line of its own.
The crash and the host loss are timed from the run's own progress, not at fixed steps:
each comes once the run has written a checkpoint past step 0 and still has at least
`--margin` steps to train. A crash the lab refuses, or a run that ended first, is
printed with the reason and its figure stays empty.
The figures are taken one after another (CPU window, A's crash test, B's host loss), so B
is well past its first checkpoint (step 150) when the benchmark turns to it: on an idle
machine at step ~290, in a loaded full test suite at 538-566, which is why runs have 1200
steps (a student's most for quick) and not 600. Each wait prints where its run was when it
began and when that checkpoint reached the API (about 0.1-0.2 s after it was written).
`--placement spread` trains the preset's ranks one per node (an instructor preset, the
lesson with placement = "spread", written into the lab's presets dir): the host lost is
run B's rank 0's node, the one whose launcher writes the run's records.
`--smoke` stops the runs once they are measured instead of training them to the end, and
runs the local executor only unless `--executors` names Ray: the cluster's start and a host
loss took 60-65 s of a smoke on the 2-core machine (the ray tier runs it).
It prints one row per executor, and exits 1 when a figure could not be measured. On a
2-core machine the runs share 2 cores: the numbers are for comparing the executors on the
same load, not for a real cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support is not installed

from tests.support.lab import free_port, spawn_server, stop_server  # noqa: E402
from tests.support.ray_cluster import NODE_CPUS  # noqa: E402  (a quick run takes one)

ENDED = ("finished", "failed", "stopped")  # server/api/schemas.py RunState
WAIT_S = 300  # for the runs to reach a state; each wait says what it waited for


class NotMeasured(Exception):
    """A figure that could not be taken; the message says why."""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RecordWatch(threading.Thread):
    """Polls one run's records; notes when each step record was first seen, and the
    steps of its checkpoint records."""

    def __init__(self, client: httpx.Client, run: str) -> None:
        super().__init__(daemon=True)
        self.client, self.run_id = client, run
        self.after = 0
        self.delays: list[float] = []
        self.steps: list[dict[str, Any]] = []
        self.ckpt_steps: list[int] = []
        # Each checkpoint record: (its step, the `t` the trainer wrote, when it was first
        # seen here, the newest step seen here by then).
        self.ckpts: list[tuple[int, float, float, int]] = []
        self.events: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                page = self.client.get(
                    f"/api/runs/{self.run_id}/records", params={"after": self.after, "limit": 5000}
                ).json()
            except (httpx.HTTPError, ValueError):
                time.sleep(0.05)
                continue
            now = time.time()
            for rec in page["records"]:
                if rec["kind"] == "step":
                    self.delays.append(now - rec["t"])
                    self.steps.append(rec)
                elif rec["kind"] == "ckpt" and rec.get("step") is not None:
                    self.ckpt_steps.append(int(rec["step"]))
                    newest = self.steps[-1]["step"] if self.steps else 0
                    self.ckpts.append((int(rec["step"]), float(rec["t"]), now, int(newest)))
                elif rec["kind"] == "event":
                    self.events.append(rec)
            if page["records"]:
                self.after = page["next_after"]
            time.sleep(0.02)

    def first_step_of(self, segment: int, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in list(self.steps):
                if rec["segment"] == segment:
                    return rec
            time.sleep(0.02)
        raise NotMeasured(f"no step of segment {segment} within {timeout:.0f} s")


def run_of(client: httpx.Client, pair: str, index: int) -> dict[str, Any]:
    return dict(client.get(f"/api/pairs/{pair}").json()["runs"][index])


def last_event(client: httpx.Client, run: str) -> str:
    events = client.get(f"/api/runs/{run}/events").json().get("events") or []
    return str(events[-1].get("text")) if events else "no event"


def wait_runs(client: httpx.Client, pair: str, ok: Any, what: str) -> list[Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        runs = client.get(f"/api/pairs/{pair}").json()["runs"]
        if ok(runs):
            return runs
        failed = [r for r in runs if r["state"] == "failed"]
        if time.monotonic() > deadline or failed:
            states = [(r["state"], r["step"]) for r in runs]
            why = "; ".join(f"{r['label']}: {last_event(client, r['id'])}" for r in failed)
            raise NotMeasured(
                f"{'a run failed' if failed else 'timed out'} waiting for {what}:"
                f" {states}{'; ' + why if why else ''}"
            )
        time.sleep(0.1)


def wait_crash_moment(
    client: httpx.Client, pair: str, index: int, watch: RecordWatch, steps: int, margin: int
) -> None:
    """Returns once the run has a checkpoint past step 0 and at least `margin` steps left
    to train; raises NotMeasured naming why when the run ends or runs past that first.
    The measurements before this one (the CPU window, run A's crash test) take as long as
    they take, so the run may be far past its first checkpoint when this wait begins: the
    line it prints says where the run was then and when that checkpoint reached the API."""
    label = "AB"[index]
    began, began_step = time.time(), None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        run = run_of(client, pair, index)
        step = run["step"] or 0
        began_step = step if began_step is None else began_step
        if run["state"] in ENDED:
            raise NotMeasured(f"run {label} ended ({run['state']}) before a checkpoint past 0")
        first = next((c for c in list(watch.ckpts) if c[0] > 0), None)
        if first is not None:
            ckpt_step, written, seen, seen_at = first
            when = (
                f"{began - seen:.2f} s before" if seen <= began else f"{seen - began:.2f} s after"
            )
            where = (
                f"run {label} was at step {began_step} of {steps} when this wait began; its"
                f" first checkpoint past 0 (step {ckpt_step}) was in the records API"
                f" {1000 * (seen - written):.0f} ms after it was written (at step {seen_at}),"
                f" {when} that"
            )
            if run["stage"] == "train" and step <= steps - margin:
                print(f"{where}; taken at step {step}", flush=True)
                return
            if step > steps - margin:
                raise NotMeasured(
                    f"{where}; at step {step} fewer than {margin} steps were left (raise --steps)"
                )
        time.sleep(0.02)
    raise NotMeasured(f"run {label} wrote no checkpoint past step 0 within {WAIT_S} s")


def crash_latency(client: httpx.Client, run: str, watch: RecordWatch) -> float:
    t0 = time.time()
    r = client.post(f"/api/runs/{run}/crash")
    if r.status_code != 202:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise NotMeasured(f"the lab refused the crash test ({r.status_code}): {detail}")
    return float(watch.first_step_of(1)["t"] - t0)


def node_dead_at(node_id: str, timeout: float = 120) -> float:
    """When the cluster's head first said the node is dead (this process is a driver)."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
            return time.time()
        time.sleep(0.02)
    raise NotMeasured(f"the head did not declare node {node_id[:8]} dead within {timeout:.0f} s")


def event_of(watch: RecordWatch, code: str, segment: int | None = None) -> dict[str, Any]:
    for rec in list(watch.events):
        if rec.get("code") == code and (segment is None or rec.get("segment") == segment):
            return rec
    raise NotMeasured(f"no {code} event{'' if segment is None else f' of segment {segment}'}")


HOST_LOSS_PARTS = (  # (name, from, to): each a point of the timeline host_loss_latency takes
    ("node declared dead (Ray health check)", "removed", "dead"),
    ("actor death → supervisor", "dead", "noticed"),
    ("new placement (actor, node)", "noticed", "placed"),
    ("mirror pull, restart event", "placed", "event"),
    ("trainer start, checkpoint load", "event", "resumed"),
    ("first recomputed step", "resumed", "step"),
)


def wait_standbys_warm(timeout: float = 120) -> None:
    """Until every node's standby (workers/ray_standby.py) has imported torch: a node lost
    minutes into a run finds them warm, and that is what the figure is for. The lab starts
    them all at once with its first runs, so a loss in the first seconds finds them still
    importing on 2 cores (the restart then waits for the rest: printed here)."""
    import ray

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == "crashdrill" and a["name"].startswith("crashdrill-standby-")
        ]
        spares: dict[str, bool] = {}  # node -> its spare is warm (a taken one is a run's)
        for name in names:
            try:
                actor = ray.get_actor(name, namespace="crashdrill")
                node = ray.get(actor.spare_on.remote(), timeout=10)
                if node is not None:
                    spares[node] = bool(ray.get(actor.warm_ready.remote(), timeout=10))
            except Exception:
                continue
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")}
        if alive and alive <= set(spares) and all(spares.values()):
            print(f"a warm standby on each of {len(alive)} nodes: waited"
                  f" {time.monotonic() - t0:.1f} s before the host loss", flush=True)  # fmt: skip
            return
        time.sleep(0.5)
    raise NotMeasured(f"the nodes' standbys were not warm within {timeout:.0f} s")


def host_loss_latency(
    client: httpx.Client, pair: str, cluster: Any, watch: RecordWatch, parts: dict[str, float]
) -> float:
    """remove_node of run B's node → the `t` of its next segment's first step; `parts` gets
    each phase's seconds (HOST_LOSS_PARTS), from the head's view of the node, the lost_host
    event's noticed_t/placed_t and t, and the new trainer's resumed event."""
    host = run_of(client, pair, 1)["host"]
    node = next((n for n in cluster.worker_nodes if n.node_id == (host or {}).get("node_id")), None)
    if node is None:
        raise NotMeasured(f"run B's host {host} is no worker node of the cluster")
    t0 = time.time()
    cluster.remove_node(node)
    at = {"removed": t0, "dead": node_dead_at(node.node_id)}
    step = watch.first_step_of(1)
    lost = event_of(watch, "lost_host")
    at.update(
        noticed=float(lost.get("noticed_t", lost["t"])),
        placed=float(lost.get("placed_t", lost["t"])),
        event=float(lost["t"]),
        resumed=float(event_of(watch, "resumed", 1)["t"]),
        step=float(step["t"]),
    )
    for name, a, b in HOST_LOSS_PARTS:
        parts[name] = at[b] - at[a]
    return float(step["t"] - t0)


def measure(executor: str, args: argparse.Namespace, work: Path, cluster: Any) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "CRASHDRILL_DATA_DIR": str(work / executor / "lab"),
        "CRASHDRILL_TELEMETRY": "0",
        "CRASHDRILL_MAX_CONCURRENT": str(2 * args.pairs),
        "CRASHDRILL_MIRROR": str(work / executor / "mirror"),
    }
    if cluster is not None:
        env["CRASHDRILL_RAY_ADDRESS"] = cluster.address
    if args.placement != "pack":  # the lesson with its ranks placed otherwise
        from dataclasses import replace

        from crashdrill.trainer.presets import dump_preset, get_preset

        lesson = get_preset(args.lesson)
        placed = replace(lesson, id=args.preset, run={**lesson.run, "placement": args.placement})
        presets = work / executor / "lab" / "presets"
        presets.mkdir(parents=True, exist_ok=True)
        (presets / f"{args.preset}.toml").write_text(dump_preset(placed))
    log = work / f"{executor}.log"
    server = spawn_server(port, env, log, start_timeout=120)
    out: dict[str, Any] = {"executor": executor, "why": {}}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            created = []
            for _ in range(args.pairs):
                overrides = {"steps": args.steps}
                r = client.post("/api/pairs", json={"preset": args.preset, "overrides": overrides})
                if r.status_code != 201:
                    raise SystemExit(f"the lab refused a pair ({r.status_code}): {r.text}")
                created.append(r.json())
            first = created[0]
            run_a, run_b = (r["id"] for r in first["runs"])
            watch_a, watch_b = RecordWatch(client, run_a), RecordWatch(client, run_b)
            watch_a.start()
            watch_b.start()

            def take(name: str, fn: Any) -> None:
                t0 = time.monotonic()
                try:
                    out[name] = fn()
                except NotMeasured as e:
                    out["why"][name] = str(e)
                    print(f"[{executor}] {name}: not measured: {e}", flush=True)
                print(f"[{executor}] {name}: took {time.monotonic() - t0:.2f} s", flush=True)

            def cpu() -> float:
                for c in created:
                    wait_runs(
                        client,
                        c["pair"],
                        lambda rs: all(
                            r["state"] == "running" and (r["step"] or 0) >= 5 for r in rs
                        ),
                        "every run training",
                    )
                proc = psutil.Process(server.pid)
                proc.cpu_percent(None)
                time.sleep(args.cpu_window_s)  # all 2 x pairs runs train meanwhile
                return float(proc.cpu_percent(None))

            def crash() -> float:
                wait_crash_moment(client, first["pair"], 0, watch_a, args.steps, args.margin)
                return crash_latency(client, run_a, watch_a)

            def host_lost() -> float:
                wait_crash_moment(client, first["pair"], 1, watch_b, args.steps, args.margin)
                wait_standbys_warm()
                parts: dict[str, float] = {}
                out["host_lost_parts"] = parts
                return host_loss_latency(client, first["pair"], cluster, watch_b, parts)

            take("server_cpu_pct", cpu)
            take("crash_to_first_recomputed_s", crash)
            if cluster is not None:
                take("host_lost_to_first_recomputed_s", host_lost)
            for c in created if args.smoke else []:  # measured: the rest would only wait
                for run in c["runs"]:
                    client.post(f"/api/runs/{run['id']}/stop")
            for c in created:
                try:
                    wait_runs(
                        client,
                        c["pair"],
                        lambda rs: all(r["state"] in ENDED for r in rs),
                        "every run's end",
                    )
                except NotMeasured as e:
                    print(f"[{executor}] {e}", flush=True)
            watch_a.stop.set()
            watch_b.stop.set()
            delays = watch_a.delays + watch_b.delays
            out["records"] = len(delays)
            if delays:
                out["record_visible_p50_ms"] = 1000 * pct(delays, 0.5)
                out["record_visible_p99_ms"] = 1000 * pct(delays, 0.99)
            else:
                out["why"]["record_visible_p50_ms"] = "no step record was seen in the API"
            ckpts = [seen - written for w in (watch_a, watch_b) for _, written, seen, _ in w.ckpts]
            out["ckpts"] = len(ckpts)
            if ckpts:
                out["ckpt_visible_p50_ms"] = 1000 * pct(ckpts, 0.5)
                out["ckpt_visible_max_ms"] = 1000 * max(ckpts)
            else:
                out["why"]["ckpt_visible_p50_ms"] = "no checkpoint record was seen in the API"
    finally:
        stop_server(server)
        if out["why"]:  # what the lab said of a run it could not start or lost
            lines = log.read_text(errors="replace").splitlines()
            said = [ln for i, _ in enumerate(lines) if "failed" in _ for ln in lines[i : i + 4]]
            print("\n".join(["the lab's log:", *said[-40:]]), flush=True)
    return out


def seconds(r: dict[str, Any], name: str) -> str:
    return f"{r[name]:.2f}s" if name in r else "—"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--executors", nargs="+", choices=["local", "ray"], help="default: local ray (smoke: local)"
    )
    p.add_argument("--pairs", type=int, default=3, help="quick pairs trained at once")
    p.add_argument("--nodes", type=int, default=3, help="Ray worker nodes (≥ 2: a host loss)")
    p.add_argument(
        "--preset",
        default="quick",
        help="the pairs' lesson: quick (1 rank), lesson-1.16 (2 ranks, crash mode kill)",
    )
    p.add_argument(
        "--placement",
        choices=["pack", "spread"],
        default="pack",
        help="a run's ranks on one node (pack) or one per node (spread)",
    )
    p.add_argument("--steps", type=int, default=1200, help="steps of each run (quick: 300)")
    p.add_argument(
        "--margin", type=int, default=100, help="steps a run must have left when it is crashed"
    )
    p.add_argument(
        "--cpu-window-s", type=float, default=10.0, help="how long the server's CPU is measured"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CI size: 1 pair, 2 nodes, 1200 steps, a 2 s window, runs stopped once measured",
    )
    args = p.parse_args()
    if args.smoke:
        args.pairs, args.nodes, args.steps, args.cpu_window_s = 1, 2, 1200, 2.0
        if args.executors is None:
            args.executors = ["local"]
            print("smoke: the local executor only (--executors local ray for both)", flush=True)
    args.executors = args.executors or ["local", "ray"]
    if args.nodes < 2 or args.pairs < 1 or args.steps <= args.margin:
        p.error("--nodes ≥ 2 (one to lose, one to move to), --pairs ≥ 1, --steps > --margin")
    from crashdrill.trainer.presets import get_preset

    args.ranks = get_preset(args.preset).config_for("A").ranks
    args.lesson = args.preset
    spread = args.placement == "spread" and args.ranks > 1
    if args.placement != "pack":
        args.preset = f"{args.preset}-{args.placement}"
    # A quick rank takes one CPU; a packed run takes its ranks' on one node, a spread one
    # one CPU on each of `ranks` nodes.
    runs_per_node = NODE_CPUS if spread else NODE_CPUS // args.ranks
    if spread and args.nodes < args.ranks + 1:
        p.error(
            f"--placement spread: --nodes ≥ {args.ranks + 1} (one to lose, the rest to move to)"
        )
    runs_on_cluster = args.nodes * runs_per_node // (args.ranks if spread else 1)
    if "ray" in args.executors and runs_on_cluster < 2 * args.pairs:
        p.error(  # else the runs beyond the cluster's CPUs queue and the CPU window never opens
            f"--nodes {args.nodes} x {NODE_CPUS} CPUs cannot train --pairs {args.pairs}"
            f" ({2 * args.pairs} runs of {args.ranks} ranks) at once:"
            f" use --nodes ≥ {-(-2 * args.pairs // max(runs_per_node, 1))}"
        )
    rows = []
    with tempfile.TemporaryDirectory(prefix="crashdrill-ray-bench-") as tmp:
        for executor in args.executors:
            cluster = None
            if executor == "ray":
                from tests.support import ray_cluster

                t = time.monotonic()
                cluster = ray_cluster.start_cluster(nodes=args.nodes)
                print(
                    f"cluster of {args.nodes} nodes up in {time.monotonic() - t:.1f}s", flush=True
                )
                import ray  # a driver of its own: it sees when the head declares a node dead

                ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
            try:
                rows.append(measure(executor, args, Path(tmp), cluster))
            finally:
                if cluster is not None:
                    ray.shutdown()
                    cluster.shutdown()
            print(rows[-1], flush=True)
    runs = 2 * args.pairs
    print()
    print(
        "executor  crash→recomputed  host lost→recomputed  record visible p50/p99"
        f"  server CPU ({runs} runs)"
    )
    missing = []
    for r in rows:
        visible = (
            f"{r['record_visible_p50_ms']:.0f}/{r['record_visible_p99_ms']:.0f} ms"
            if "record_visible_p50_ms" in r
            else "—"
        )
        cpu = f"{r['server_cpu_pct']:.1f} %" if "server_cpu_pct" in r else "—"
        print(
            f"{r['executor']:<8}  {seconds(r, 'crash_to_first_recomputed_s'):>16}"
            f"  {seconds(r, 'host_lost_to_first_recomputed_s'):>20}"
            f"  {visible:>22}  {cpu:>10}"
        )
        missing += [f"{r['executor']}: {name}: {why}" for name, why in r["why"].items()]
    for r in rows:
        if "ckpt_visible_p50_ms" in r:
            print(
                f"{r['executor']}: checkpoint record written → in the records API:"
                f" p50 {r['ckpt_visible_p50_ms']:.0f} ms, max {r['ckpt_visible_max_ms']:.0f} ms"
                f" ({r['ckpts']} checkpoints)"
            )
    for r in rows:
        if r.get("host_lost_parts"):
            print(f"{r['executor']}: host lost → first recomputed step, its parts:")
            for name, secs in r["host_lost_parts"].items():
                print(f"  {name:<34} {secs:6.2f} s")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"ranks per run {args.ranks}; load average {load}")
    if missing:
        print("not measured:\n  " + "\n  ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

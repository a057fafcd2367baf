"""The page's words for a Ray cluster (web/static/cluster.js), run in node: the banner
while the cluster is unreachable, and which nodes' samples the machine panel shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "web" / "static" / "cluster.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the page's module")


def run_js(body: str) -> Any:
    module = json.dumps(MODULE.as_uri())
    code = f"import({module}).then((m) => {{ console.log(JSON.stringify({body})); }})"
    assert NODE is not None
    env = {**os.environ, "TZ": "UTC"}
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def test_the_banner_names_the_address_and_since_when_while_the_cluster_is_unreachable() -> None:
    lost = {"kind": "ray", "address": "head:6379", "reachable": False, "since": 3723.0}
    back = {**lost, "reachable": True, "since": None}
    local = {"kind": "local", "address": None, "reachable": True, "since": None}
    texts = run_js(
        f"[m.clusterBanner({json.dumps(lost)}), m.clusterBanner({json.dumps(back)}),"
        f" m.clusterBanner({json.dumps(local)}), m.clusterBanner(null)]"
    )
    assert texts == [
        "The Ray cluster at head:6379 is unreachable since 01:02:03: runs keep training on"
        " their nodes; their records catch up when it is back.",
        None,
        None,
        None,
    ]


def test_the_panel_shows_the_nodes_the_runs_are_on_each_once_in_the_runs_order() -> None:
    samples = [
        ["n1", {"t": 1, "node": {"node_id": "n1"}}],
        ["n2", {"t": 2, "node": {"node_id": "n2"}}],
    ]
    hosts = [{"node_id": "n2"}, None, {"node_id": "n2"}, {"node_id": "n1"}, {"node_id": "n9"}]
    picked = run_js(f"m.pairNodes(new Map({json.dumps(samples)}), {json.dumps(hosts)})")
    assert [s["node"]["node_id"] for s in picked] == ["n2", "n1"]

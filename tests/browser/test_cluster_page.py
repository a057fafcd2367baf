"""The machine panel's blocks for Ray nodes and the cluster banner, in a real Chromium:
the page's own modules render samples shaped as a node sends them (no cluster needed; the
server side is tests/integration/test_ray_lab.py, the banner's words
tests/unit/test_cluster_js.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_the_machine_panel_draws_one_block_per_node_labelled_by_its_name(
    lab_server: Any, page: Any
) -> None:
    page.goto(lab_server.url + "/?preset=browser")
    got = page.evaluate(
        """async () => {
            const { MachinePanel } = await import('/static/machine.js');
            const root = document.querySelector('#machine');
            const panel = new MachinePanel(root);
            const sample = (id, name, t) => ({
                kind: 'telemetry', t, node: { node_id: id, name }, gpu_state: 'no_gpu',
                cpu_pct: 42, ram_used_bytes: 1e9, ram_total_bytes: 8e9,
            });
            panel.updateNodes([sample('n1', 'box/n1', Date.now() / 1000),
                               sample('n2', 'box/n2', Date.now() / 1000)]);
            const blocks = [...root.querySelectorAll('.node-block')].map((b) => ({
                name: b.querySelector('.node-name').textContent,
                cpu: b.querySelector('[data-tile=cpu] .tile-value').textContent,
                gpuTiles: b.querySelectorAll('[data-tile=gpu]').length,
            }));
            panel.updateNodes([]);
            return { blocks, hiddenAfter: root.querySelector('.node-blocks').hidden };
        }"""
    )
    assert got["blocks"] == [
        {"name": "Node box/n1", "cpu": "42%", "gpuTiles": 0},
        {"name": "Node box/n2", "cpu": "42%", "gpuTiles": 0},
    ]
    assert got["hiddenAfter"] is True  # one machine: no node blocks, today's panel
    assert page.locator("#cluster-banner").is_hidden()
    assert page.errors == []

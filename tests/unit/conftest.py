"""The unit tier's labs start no warm trainer process (workers/warm.py) unless a test asks
for one with the `warm` marker: their runs are stand-ins or never start, and a warm process
per app would import torch for nothing hundreds of times. The integration and browser
tiers keep the product's default (on), and tests/integration/test_warm_trainers.py builds
its own."""

from __future__ import annotations

import pytest

from crashdrill.workers.warm import ENV_SWITCH


@pytest.fixture(autouse=True)
def _no_warm_trainers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("warm") is None:
        monkeypatch.setenv(ENV_SWITCH, "0")

"""The warm trainer process (workers/warm.py) off for a test directory's labs unless a test
asks for one with the `warm` marker: their runs are stand-ins or never start, and a warm
process per app would import torch for nothing hundreds of times. A conftest imports the
fixture (tests/unit/conftest.py, tests/integration/stand_ins/conftest.py)."""

from __future__ import annotations

import pytest

from crashdrill.workers.warm import ENV_SWITCH


@pytest.fixture(autouse=True)
def no_warm_trainers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("warm") is None:
        monkeypatch.setenv(ENV_SWITCH, "0")

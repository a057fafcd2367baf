"""The unit tier's labs start no warm trainer process (workers/warm.py) unless a test asks
for one with the `warm` marker: their runs are stand-ins or never start, and a warm process
per app would import torch for nothing hundreds of times. The integration and browser
tiers keep the product's default (on), and tests/integration/test_warm_trainers.py builds
its own; tests/integration/stand_ins/ turns it off as this tier does."""

from __future__ import annotations

from tests.support.warm_switch import no_warm_trainers

__all__ = ["no_warm_trainers"]

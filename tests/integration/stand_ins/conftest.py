"""Tests that start real subprocesses but no real training: labs whose runs are stand-in
trainers (tests/support/lab.py STAND_IN), supervised toy trainers, the drill's engine on
small scripts, a command line in a fresh interpreter. Seconds each, so they left the unit
tier (which should run in under two minutes); like it, their labs start no warm trainer
process unless a test is marked `warm`."""

from __future__ import annotations

from tests.support.warm_switch import no_warm_trainers

__all__ = ["no_warm_trainers"]

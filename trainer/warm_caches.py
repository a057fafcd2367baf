"""What a warm process computes once so that every trainer forked from it finds it done:
imported by the fork server with the rest of its preload (processes/forkserver_protocol.py
TRAINER_PRELOAD). Only answers that hold for the machine's lifetime, never a run's state.

- the CPU's name the MFU peak is cached under (metrics.cpu_name: a `uname -p` subprocess,
  8 ms of every restart before its first step).
"""

from __future__ import annotations

from crashdrill.trainer import metrics

metrics.cpu_name()

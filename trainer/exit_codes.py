"""Exit statuses of crashdrill's processes, in one home: the trainer returns them, the
supervisor, the drill and the lab compare what they got against these names, never
against a number.

    from crashdrill.trainer.exit_codes import EXIT_NO_CHECKPOINT
    if code == EXIT_NO_CHECKPOINT: ...        # a restart that found nothing to resume

Every command (`crashdrill run|verify|inspect|presets|doctor|serve`):
  EXIT_OK             0   done: finished, every check passed
  EXIT_FAILED         1   a check failed (a resume not bit-identical, a doctor's problem,
                          a checkpoint that lacks what --require named); an uncaught error
                          also exits 1, as Python does
  EXIT_USAGE          2   bad usage or input: a preset, a setting, a run dir, a file, a URL

`crashdrill run` (the trainer) adds:
  EXIT_NO_CHECKPOINT  3   told a checkpoint must exist (--require-checkpoint, every
                          restart by a supervisor) and none verified: it refuses to train
                          from scratch (trainer/loop.py)
  EXIT_DIVERGED       4   the loss or the gradient norm turned NaN or infinite: stopped,
                          nothing saved after it; not restarted (trainer/divergence.py)
  EXIT_STOPPED        75  stopped gracefully (SIGTERM, SIGINT, its time budget) with a
                          complete checkpoint of its last step: the same command resumes it
                          (trainer/preemption.py). EX_TEMPFAIL (sysexits.h): "a temporary
                          failure; the user is invited to retry"

A command whose output was closed (`crashdrill … | head`) exits 141, 128 + SIGPIPE, as a
shell reports it (crashdrill/closed_output.py, below the trainer).

`crashdrill verify` adds, 128 + the signal as a shell reports it:
  EXIT_SIGINT         130  stopped by SIGINT (Ctrl-C) after its report of what it saw,
  EXIT_SIGTERM        143  or by SIGTERM: every process killed, temp dirs removed
                           (drill/interrupt.py) Killed by a signal, a
process has no status of its own: Python's subprocess reports -9 for SIGKILL, a shell
128 + 9.

Imports nothing: every layer above the trainer reads these names.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_CHECKPOINT = 3
EXIT_DIVERGED = 4
EXIT_STOPPED = 75
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

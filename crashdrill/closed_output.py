"""Exit quietly when whoever reads our output has gone: `crashdrill presets show quick |
head` must end like any Unix tool at the end of a pipe, not with a BrokenPipeError
traceback (nor Python's "Exception ignored … BrokenPipeError" at shutdown).

    return quiet_when_output_closed(lambda: run(args))

The exit status is 141 (128 + SIGPIPE), what a shell reports for a tool killed by the
same closed pipe; `set -o pipefail` sees it as such.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

EXIT_OUTPUT_CLOSED = 128 + 13  # 128 + SIGPIPE, as a shell reports `yes | head`


def quiet_when_output_closed(command: Callable[[], int]) -> int:
    """Run `command`; when stdout or stderr is closed under it, exit 141 without a word."""
    try:
        code = command()
        sys.stdout.flush()  # a closed pipe surfaces here for output still buffered
        return code
    except BrokenPipeError:
        _silence_closed_streams()
        return EXIT_OUTPUT_CLOSED


def _silence_closed_streams() -> None:
    """Point stdout and stderr at /dev/null, so that the interpreter's final flush of what
    is still buffered does not fail a second time and print 'Exception ignored'."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)

"""A forked child's exit (crashdrill/processes/forkserver_loop.py exit_without_teardown):
atexit handlers and weakref finalizers still run, except torch.library's deregistration of
its operator libraries, which the process's end makes moot (~35 ms of a launcher's exit,
between its group's end and the supervisor's restart)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import torch
import torch.library

from crashdrill.processes import forkserver_loop


def test_only_torch_library_finalizers_are_told_not_to_run_at_exit() -> None:
    class Held:
        pass

    held = Held()
    other = weakref.finalize(held, print, "a temporary dir's removal")
    lib = torch.library.Library("crashdrill_exit_test", "DEF")  # noqa: F841  (held to exit)
    ours = [
        f
        for f, info in weakref.finalize._registry.items()  # type: ignore[attr-defined]
        if info.func is torch.library._del_library
    ]
    assert ours, "torch.library registers no finalizer: the skip has nothing to do"
    try:
        forkserver_loop._skip_op_deregistration()
        assert all(not f.atexit for f in ours)
        assert other.atexit
    finally:
        for f in ours:
            f.atexit = True
        other.detach()


def test_the_exit_still_runs_atexit_handlers_and_other_finalizers(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    code = textwrap.dedent(
        f"""
        import atexit, weakref, torch, torch.library
        from crashdrill.processes.forkserver_loop import exit_without_teardown
        marks = {str(marks)!r}
        def mark(word):
            with open(marks, "a") as f:
                f.write(word + "\\n")
        class Held: pass
        held = Held()
        weakref.finalize(held, mark, "finalizer")
        atexit.register(mark, "atexit")
        lib = torch.library.Library("crashdrill_exit_test", "DEF")
        exit_without_teardown(3)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert sorted(marks.read_text().split()) == ["atexit", "finalizer"]

"""`crashdrill inspect` as evidence in the drill's diagnosis: when a resume diverges at
once, what the run's checkpoint holds tells a missing optimizer from a missing RNG state.

    look = CheckpointLook(crash_dir)     # nothing is read yet
    look.sentence()                      # " `crashdrill inspect` … lacks optimizer state, …"

The checkpoint is inspected at most once per drill, and only when a finding asks for it
(a child process that imports torch: about a second), so a passing drill pays nothing.
"""

from __future__ import annotations

from pathlib import Path

from crashdrill.drill.checkpoint_inspect import (
    PARTS,
    InspectError,
    Inventory,
    inspect,
    missing_words,
)


class CheckpointLook:
    def __init__(self, root: Path, timeout: float = 60.0) -> None:
        self.root = root
        self.timeout = timeout
        self._done = False
        self._inv: Inventory | None = None
        self.error: str | None = None

    def inventory(self) -> Inventory | None:
        if not self._done:
            self._done = True
            try:
                self._inv = inspect(self.root, self.timeout)
            except InspectError as e:
                self.error = str(e)
        return self._inv

    def sentence(self) -> str:
        """One evidence sentence for a finding (starting with a space), or ""."""
        inv = self.inventory()
        if inv is None:
            return ""
        where = Path(inv.checkpoint)
        try:
            name = where.relative_to(self.root).as_posix()
        except ValueError:
            name = where.name
        name = name if name not in ("", ".") else "its checkpoint dir"
        what = f" `crashdrill inspect` on the crashed run's checkpoint ({name}, {inv.format})"
        if inv.lacks and inv.parts["model"].lacking:  # no tensors at all: a JSON file, say
            return (
                f"{what}: it holds no model tensors, so state kept as plain numbers is not"
                f" recognised; by content it lacks {missing_words(inv)}."
            )
        if inv.lacks:
            return f"{what}: it lacks {missing_words(inv)}."
        held = [PARTS[p.name] for p in inv.parts.values() if p.status in ("present", "derived")]
        return (
            f"{what} finds {', '.join(held)} in it: the script saves this state, so suspect "
            "how it restores it."
        )

"""`crashdrill inspect` as evidence in the drill's diagnosis: when a resume diverges at
once, what the run's checkpoint holds tells state that was never saved (`state-missing`)
from state that was saved but not restored (`saved-not-restored`).

    look = CheckpointLook(crash_dir)           # nothing is read yet
    code, said = look.explain("batch")         # the first resumed loss differs
    code, said = look.explain("update")        # the first matches, the second differs
    look.lacking()                             # ["optimizer", "rng"]: by content only

Only what inspect recognises by content counts (drill/checkpoint_parts.py): model tensors,
optimizer state, RNG states, an LR scheduler's or a grad scaler's state dict. A data
position or a step counter is known only by its key's name, so the diagnosis never says a
checkpoint holds one or lacks one: a key named `data` proves nothing, and batches that are
a function of the step need no position at all.

The checkpoint is inspected at most once per drill, and only when a finding asks for it
(a child process that imports torch: about a second), so a passing drill pays nothing.
"""

from __future__ import annotations

from pathlib import Path

from crashdrill.drill.checkpoint_inspect import PARTS, InspectError, Inventory, Part, inspect
from crashdrill.drill.finding_codes import SAVED_NOT_RESTORED, STATE_MISSING

# The parts inspect recognises by their content, in the order a finding names them: the
# optimizer first (what a weights-only checkpoint lacks and the trace shows least).
BY_CONTENT = ("optimizer", "rng", "scheduler", "amp", "model")
WORDS = {
    **PARTS,
    "optimizer": "optimizer state (momentum or Adam moments, step counts)",
}
# What explains a divergence at the first resumed step (the batch) or at the second (the
# update), in the order the finding names them.
EXPLAINS = {"batch": ("rng",), "update": ("optimizer", "scheduler", "amp")}
TRACE = {
    "batch": "the batch or the weights differ",
    "update": "the update differs",
}
HEDGED = {
    "batch": " — the checkpoint lacks (or the script does not restore) the RNG state or the "
    "data position",
    "update": " — optimizer state (momentum, Adam moments, step count) or the LR-schedule "
    "position is missing from the checkpoint (or not restored)",
}
NO_POSITION = (
    " (a data position is not recognisable by its content: whether one was saved is not known)"
)


def _by_content(p: Part) -> bool:
    return any(not f.by_name for f in p.found)


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

    def _tensors(self, inv: Inventory) -> bool:
        """It holds model tensors: without any (a JSON file of plain numbers), state kept
        as numbers is not recognised, so "lacks" would not be evidence."""
        return not inv.parts["model"].lacking

    def holding(self) -> list[str]:
        """The parts recognised in it by content, in BY_CONTENT order."""
        inv = self.inventory()
        if inv is None:
            return []
        return [
            n for n in BY_CONTENT if inv.parts[n].status == "present" and _by_content(inv.parts[n])
        ]

    def lacking(self) -> list[str]:
        """The parts it lacks, by content (never a data position or a step counter); an
        LR scheduler or grad scaler only when inspect knows the run used one."""
        inv = self.inventory()
        if inv is None:
            return []
        return [n for n in BY_CONTENT if inv.parts[n].lacking]

    def _name(self, inv: Inventory) -> str:
        where = Path(inv.checkpoint)
        try:
            name = where.relative_to(self.root).as_posix()
        except ValueError:
            name = where.name
        name = name if name not in ("", ".") else "its checkpoint dir"
        return f"`crashdrill inspect` on the crashed run's checkpoint ({name}, {inv.format})"

    def _detail(self, inv: Inventory, part: str) -> str:
        found = [f for f in inv.parts[part].found if not f.by_name]
        return f"{PARTS[part]} ({found[0].detail})" if found else PARTS[part]

    def lacks_sentence(self) -> str:
        """ " `crashdrill inspect` …: it lacks optimizer state (…), RNG states." or ""."""
        inv = self.inventory()
        if inv is None:
            return ""
        lacking = self.lacking()
        if not self._tensors(inv):
            others = [p for p in lacking if p != "model"]  # said already, first
            return (
                f" {self._name(inv)}: it holds no model tensors, so state kept as plain numbers"
                f" is not recognised; by content it lacks {_words(others)}."
            )
        if not lacking:
            return ""
        return f" {self._name(inv)}: it lacks {_words(lacking)}."

    def explain(self, at: str) -> tuple[str, str]:
        """The code and the text of a finding about a resume that diverged at its first
        step (`at` "batch") or its second ("update"): saved but not restored when the
        checkpoint holds, by content, the state that explains it; missing when it lacks
        it; the trace's words, hedged, when the checkpoint could not be read, or holds no
        tensors (then only what it is found to hold is evidence, never what it lacks)."""
        inv = self.inventory()
        head = TRACE[at]
        if inv is None:
            return STATE_MISSING, head + HEDGED[at]
        held, lacking = self.holding(), self.lacking()
        saved = [p for p in EXPLAINS[at] if p in held]
        missing = [p for p in EXPLAINS[at] if p in lacking]
        position = NO_POSITION if at == "batch" else ""
        tensors = self._tensors(inv)
        if not saved and not tensors:
            return STATE_MISSING, head + HEDGED[at] + "." + self.lacks_sentence()
        if saved:
            rest = [p for p in held if p not in saved and p != "model"]
            holds = ", ".join(self._detail(inv, p) for p in [*saved, *rest])
            also = f"; it lacks {_words(lacking)}" if lacking and tensors else ""
            what = "the RNG state" if at == "batch" else "the optimizer state"
            return SAVED_NOT_RESTORED, (
                f"{head}, although the checkpoint holds that state: saved but not restored. "
                f"{self._name(inv)} finds {holds} in it{also}, so the restart does not put back "
                f"{what} it saved (or draws from it before restoring it){position}."
            )
        if missing:
            what = "the RNG state is" if at == "batch" else "the optimizer state is"
            if held == ["model"]:  # weights only: the optimizer first, the trace shows it least
                what = f"a weights-only checkpoint: the {WORDS['optimizer']}"
                what += " and the RNG state are" if at == "batch" else " is"
            return STATE_MISSING, f"{head} — {what} not saved{position}.{self.lacks_sentence()}"
        # It holds what explains this step (or the run needs none of it): the restore is
        # the suspect, or a data position that is not recognisable.
        holds = ", ".join(self._detail(inv, p) for p in held if p != "model") or "model tensors"
        return SAVED_NOT_RESTORED, (
            f"{head}, although the checkpoint holds the state a resume needs: saved but not "
            f"restored{position}. {self._name(inv)} finds {holds} in it: the script saves this "
            "state, so suspect how it restores it."
        )


def _words(parts: list[str]) -> str:
    return ", ".join(WORDS[p] for p in parts) or "nothing it recognises"

"""What the drill saw of checkpoint writes, as evidence for its notes: how the reference
run wrote (under temp names and renamed, or in place under the final names), and whether
a checkpoint a kill left behind was really incomplete.

    watch = WriteObserver(ref_dir)           # the engine polls it while the reference runs
    watch.poll(time.monotonic())
    watch.sentences()                        # ["checkpoint-0008/ was filled in under its …"]
    incomplete_proof(partial, before, after, reference_snapshot)   # [] when nothing shows it

Only checkpoint content counts, recognised by its first bytes (`looks_like_checkpoint`: a
torch.save zip, a pickle, safetensors, a JSON object): a log appended at every step grows
in place by design and says nothing about how checkpoints are written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from crashdrill.drill.snapshot import Snapshot, final_names, modified_in_place, scan

POLL_SECONDS = 0.02  # a write of a small checkpoint dir lasts tens of milliseconds
SHOWN = 3  # sentences kept: the first writes tell the pattern
ZIP, SAFETENSORS_MAX_HEADER = b"PK\x03\x04", 100 << 20


def looks_like_checkpoint(path: Path) -> bool:
    """A file whose first bytes are a checkpoint's: a zip (torch.save, Lightning .ckpt), a
    pickle of protocol 2-5 (legacy torch.save, DCP .metadata), safetensors (an 8-byte
    header length, then JSON), or a JSON object in a .json file."""
    try:
        with path.open("rb") as f:
            head = f.read(9)
    except OSError:
        return False
    if head.startswith(ZIP):
        return True
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    if len(head) == 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 0 < n < SAFETENSORS_MAX_HEADER:
            return True
    if path.suffix == ".json":
        try:
            return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
        except json.JSONDecodeError as e:  # a second document: JSON lines, a log
            return e.msg != "Extra data" and head.lstrip().startswith(b"{")  # being written
        except (OSError, ValueError):
            return False
    return False


def _top(rel: str) -> str | None:
    return rel.split("/", 1)[0] if "/" in rel else None


class WriteObserver:
    """Polls a run's checkpoint dir (every POLL_SECONDS at most) and keeps what shows a
    write under final names: a checkpoint file that grew or changed in place (same
    inode), or a new dir (`checkpoint-8/`) that gained files after it first appeared —
    an atomic writer's files and dirs appear complete, by a rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prev: Snapshot | None = None
        self._last = 0.0
        self._first_seen: dict[str, int] = {}  # new top dir → files when first seen
        self._seen: list[str] = []
        self._said: set[str] = set()

    def poll(self, now: float) -> None:
        if now - self._last < POLL_SECONDS:
            return
        self._last = now
        snap = scan(self.root)
        prev, self._prev = self._prev, snap
        if prev is None or snap == prev:  # most polls: nothing changed, nothing to read
            return
        for rel in modified_in_place(prev, snap):
            if _top(rel) in self._first_seen:
                continue  # a file of a new dir: the dir's filling in is the evidence
            if rel not in self._said and looks_like_checkpoint(self.root / rel):
                self._say(rel, f"{rel} grew or changed in place under its final name")
        finals = set(final_names(snap))
        old_tops = {_top(k) for k in prev}
        for top in {t for k in finals if (t := _top(k)) is not None}:
            files = [k for k in finals if k.startswith(top + "/")]
            if top not in old_tops:
                self._first_seen.setdefault(top, len(files))
            elif top in self._first_seen and len(files) > self._first_seen[top]:
                shown = [self.root / k for k in files]
                if f"{top}/" not in self._said and any(looks_like_checkpoint(p) for p in shown):
                    self._say(
                        f"{top}/",
                        f"{top}/ was filled in under its final name (first seen with "
                        f"{self._first_seen[top]} file(s), later {len(files)})",
                    )

    def _say(self, key: str, sentence: str) -> None:
        self._said.add(key)
        if len(self._seen) < SHOWN:
            self._seen.append(sentence)

    def sentences(self) -> list[str]:
        return list(self._seen)


def _shape(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def incomplete_proof(
    partial: list[str],
    before: Snapshot | None,
    after: Snapshot | None,
    reference: Snapshot | None,
) -> list[str]:
    """Sentences that show a checkpoint a kill left under its final name was incomplete
    (`partial`: appeared_incomplete's names, `dir/` or a file): a temp file of its write
    still in it; a dir lacking files that a complete one of the same name shape holds (in
    the dir before the kill, or the reference's at its end); a file smaller than the
    reference's of the same name. [] when nothing shows it (it may have been complete)."""
    after = after or {}
    out: list[str] = []
    for name in partial:
        if name.endswith("/"):
            said = _dir_proof(
                name, after, [("before the kill", before), ("in the reference run", reference)]
            )
            out += [said] if said else []
        elif reference and name in reference and name in after:
            mine, theirs = after[name][1], reference[name][1]
            if mine < theirs:
                out.append(f"{name} was {mine:,} bytes, the reference's {theirs:,}: cut short")
    return out


def _files_in(snap: Snapshot | None, top: str) -> set[str]:
    return {k.split("/", 1)[1] for k in final_names(snap) if k.startswith(top + "/")}


def _dir_proof(name: str, after: Snapshot, others: list[tuple[str, Snapshot | None]]) -> str:
    top = name[:-1]
    inside = {k.split("/", 1)[1] for k in after if k.startswith(name)}
    temps = sorted(inside - _files_in(after, top))
    if temps:
        return f"{name} still held {', '.join(temps[:3])} (a temp file of its write)"
    for label, snap in others:
        siblings = {t for k in snap or {} if (t := _top(k)) and t != top}
        for sib in sorted((t for t in siblings if _shape(t) == _shape(top)), reverse=True):
            lacks = sorted(_files_in(snap, sib) - inside)
            if lacks:
                return f"{name} lacks {', '.join(lacks[:3])}, which {sib}/ holds ({label})"
    return ""

"""What a checkpoint dir holds at one moment, and what a write killed midway left in it.

    before = scan(root)                 # …a kill inside a write, then once it is dead:
    after = scan(root)
    modified_in_place(before, after)    # files overwritten in place (not renamed over)
    appeared_incomplete(before, after)  # new files under final names: a torn new checkpoint
    dcp_dirs(after)                     # DCP dirs → complete (its .metadata is there)?

Temp files (`x.tmp`, `tmp…`, `x~`, anything under a `*.tmp/` dir) are an atomic writer's
work in progress: neither counts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

Snapshot = dict[str, tuple[int, int, int]]  # relative path → (inode, size, mtime_ns)


def scan(root: Path) -> Snapshot:
    """Every file under `root` with its inode, size and mtime: cheap enough to poll every
    few milliseconds for a small checkpoint dir."""
    out: Snapshot = {}
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed between listing and stat: a write in progress
                rel = os.path.relpath(e.path, root).replace(os.sep, "/")
                out[rel] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


TEMP_NAME = re.compile(r"(^|/)(tmp[^/]*|[^/]*\.(tmp|temp|part|partial|new)|[^/]*~)(/|$)")


def final_names(snap: Snapshot | None) -> list[str]:
    """The files of a snapshot that are not temp files (what a loader may look at)."""
    return [k for k in snap or {} if not TEMP_NAME.search(k)]


def appeared_incomplete(before: Snapshot | None, after: Snapshot | None) -> list[str]:
    """What a write killed midway left under a final (not temp) name: files that were not
    there before it, named by their top folder when that folder is new too (`checkpoint-200/`,
    the way a Hugging Face Trainer writes one), else by their path. A writer that builds
    under a temp name and renames it when complete leaves nothing here."""
    if before is None or after is None:
        return []
    old_dirs = {k.split("/", 1)[0] for k in before if "/" in k}
    out: set[str] = set()
    for k in after:
        if k in before or TEMP_NAME.search(k):
            continue
        top = k.split("/", 1)[0]
        out.add(f"{top}/" if "/" in k and top not in old_dirs else k)
    return sorted(out)


def modified_in_place(before: Snapshot | None, after: Snapshot | None) -> list[str]:
    """Checkpoint files that kept their inode but changed size or mtime: overwritten in
    place, not replaced by a rename (an atomic writer's files get a new inode each time).
    Temp files (`x.tmp`, `tmp…`, `x~`, anything under a `*.tmp/` dir) are left out: an
    atomic writer writes those in place by design, a stale one from an earlier kill too."""
    if not before or not after:
        return []
    return sorted(
        k
        for k, v in before.items()
        if k in after and after[k][0] == v[0] and after[k] != v and not TEMP_NAME.search(k)
    )


DCP_METADATA = ".metadata"  # torch.distributed.checkpoint writes it last, once every shard is


def dcp_dirs(snap: Snapshot | None) -> dict[str, bool]:
    """Every folder under a final name that holds a DCP checkpoint (`*.distcp` shards or
    its `.metadata`) → whether it is complete: DCP's FileSystemWriter writes `.metadata`
    after every rank's shards, so shards without it are a write that did not finish.
    The folder is "" for the checkpoint dir itself."""
    out: dict[str, bool] = {}
    for k in final_names(snap):
        folder, _, name = k.rpartition("/")
        if name == DCP_METADATA:
            out[folder] = True
        elif name.endswith(".distcp"):
            out.setdefault(folder, False)
    return out

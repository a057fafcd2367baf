"""What a file is, from its first bytes: the formats a checkpoint comes in, and the ones a
weights export that is not a checkpoint comes in. No torch, nothing loaded.

    s = sniff(Path("model.bin"))
    s.kind         # "torch-zip", "pickle", "safetensors", "npy", "gguf", "hdf5", "json", …
    s.checkpoint   # True for what `crashdrill inspect` opens as a checkpoint
    s.what         # "a raw float32 array of 1,024 values? (4,096 bytes, a multiple of 4) …"

`crashdrill inspect` sniffs before it opens: a `.bin` that is not a torch.save file is
named for what it might be instead of failing inside torch's unpickler.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

HEAD = 64

# kinds that drill/checkpoint_open.py opens as a checkpoint
CHECKPOINT_KINDS = ("torch-zip", "pickle", "safetensors", "json")


@dataclass(frozen=True)
class Sniff:
    kind: str
    what: str  # a phrase: "a torch.save file (zip archive)", "a numpy .npy array", …

    @property
    def checkpoint(self) -> bool:
        return self.kind in CHECKPOINT_KINDS


def _safetensors_header(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def _zip_kind(path: Path) -> Sniff:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return Sniff("torn-zip", "a zip archive that cannot be listed: a torn torch.save file?")
    if any(n.endswith("data.pkl") for n in names):
        return Sniff("torch-zip", "a torch.save file (zip archive with data.pkl)")
    if names and all(n.endswith(".npy") for n in names):
        return Sniff("npz", f"a numpy .npz archive of {len(names)} array(s)")
    shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    return Sniff("zip", f"a zip archive that is not a torch.save file ({shown or 'empty'})")


def sniff(path: Path) -> Sniff:
    """What `path` holds, by its magic bytes (and its size for raw arrays)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEAD)
    if not head:
        return Sniff("empty", "an empty file (0 bytes: torn, or never written)")
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_kind(path)
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return Sniff("pickle", f"a Python pickle (protocol {head[1]}; a legacy torch.save file)")
    if _safetensors_header(head, size):
        return Sniff("safetensors", "a safetensors file")
    if head.startswith(b"\x93NUMPY"):
        return Sniff("npy", "a numpy .npy array (np.save)")
    if head.startswith(b"GGUF"):
        return Sniff("gguf", "a GGUF model file (llama.cpp)")
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return Sniff("hdf5", "an HDF5 file (Keras .h5, h5py)")
    text = _text(path, head)
    if text is not None:
        return text
    raw = f"raw bytes ({size:,} bytes)"
    if size % 4 == 0:
        raw = (
            f"a raw float32 array of {size // 4:,} values? ({size:,} bytes, a multiple of 4:"
            " what tensor.numpy().tofile() writes; it holds no names, shapes or dtype)"
        )
    elif size % 2 == 0:
        raw = f"a raw float16/bfloat16 array of {size // 2:,} values? ({size:,} bytes)"
    return Sniff("raw", raw)


def _text(path: Path, head: bytes) -> Sniff | None:
    if b"\x00" in head:
        return None
    try:
        sample = path.read_bytes()[: 1 << 20].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(not (c.isprintable() or c in "\t\n\r") for c in sample[:4096]):
        return None  # control characters: binary that happens to be valid UTF-8
    stripped = sample.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            json.loads(path.read_text(encoding="utf-8"))
            return Sniff("json", "a JSON document")
        except ValueError:
            return Sniff("json", "JSON that does not parse (torn?)")
    return Sniff("text", f"plain text ({stripped[:40]!r}…)")


def not_a_checkpoint(s: Sniff) -> str:
    """Why a file is not read as a checkpoint: what it is not, and what it might be."""
    return (
        "not a checkpoint crashdrill inspect reads: not a torch.save file (neither a zip "
        f"archive with data.pkl nor a pickle), not safetensors, not JSON; it looks like {s.what}"
    )

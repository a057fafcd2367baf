"""Unpicklers that run no code of the file's choosing, for `crashdrill inspect`
(drill/checkpoint_open.py): each names the globals it allows, and refuses any other with
its name ("Unsupported global: GLOBAL module.name"), as torch's weights-only loader does.

    DCPMetadataUnpickler(f).load()   # a DCP dir's `.metadata`: DCP's dataclasses, dtypes
    PlainUnpickler(f).load()         # a script's pickle.dump of dicts, lists and numbers
"""

from __future__ import annotations

import pickle
from typing import Any

DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",  # an Enum: called with its value, a lookup
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},  # a layout by its name: torch.strided
    "collections": {"OrderedDict"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
}


class DCPMetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata` and nothing else: every global it may name is one of
    DCP's metadata dataclasses or a torch dtype/layout constant (data, no code); any other
    is refused with the name, like torch's weights-only loader does. torch's own
    weights-only unpickler cannot be used here: it reads pickle protocol 2 only, and DCP
    writes protocol 4."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
                return value
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of DCP metadata")


class PlainUnpickler(pickle.Unpickler):
    """A pickle of builtins only (dicts, lists, numbers, strings: what a research script's
    `pickle.dump(state, f)` of plain Python writes). Every global is refused, so nothing is
    imported or called: torch's weights-only loader rejects such a file (no torch magic)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a persistent id: a torch.save file")

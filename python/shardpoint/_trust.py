"""What a checkpoint's pickles may make this process do: nothing a checkpoint names runs.

A checkpoint is untrusted input. Three kinds of pickle reach the package from one:

- ``.metadata`` is decoded by the engine's pickle reader, which executes nothing and refuses
  anything that is not DCP metadata (naming the file and the offending global). The engine
  encodes the decoded values again; Python unpickles only that re-encoding, with an
  unpickler that resolves nothing but the few classes the engine writes
  (``metadata_from_engine``). A path class of another Python (``pathlib._local`` on 3.13)
  never reaches Python at all, so metadata written under any Python reads under any other.
- Bytes items (pickled objects in ``.distcp`` files) are handed to DCP's planner, which
  unpickles them with ``torch.load`` unrestricted. They are first loaded with
  ``weights_only=True`` (``screen_bytes_item``): PyTorch's allowlist plus whatever the user
  added with ``torch.serialization.add_safe_globals`` / ``safe_globals``; a refused item is
  an error naming the item and the global.
- ``meta.pt`` and full checkpoints are ``torch.load``-ed with ``weights_only=True`` unless
  the caller passes ``False`` (``weights_only_default``), on every PyTorch (before 2.6 its
  default was ``False``).

``StorageReader(trusted=True)`` skips the screening of bytes items for checkpoints the user
vouches for; ``.metadata`` is decoded by the engine always (it reads whatever PyTorch's writers
put there, custom planner data as data), so no ``.metadata`` is ever unpickled as it comes.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any, Dict, Optional, Tuple

import torch
from torch.distributed.checkpoint import Metadata
from torch.distributed.checkpoint import metadata as _dcp_metadata
from torch.distributed.checkpoint import filesystem as _dcp_filesystem

from . import errors

__all__ = ["metadata_from_engine", "screen_bytes_item", "weights_only_default"]

# TensorProperties moved from torch.distributed._shard.sharded_tensor.metadata (<= 2.2) to
# torch.distributed.checkpoint.metadata (2.3+); the engine writes the old path, which every
# PyTorch 2.x resolves. The enum its state holds must be the one the chosen class compares with.
if hasattr(_dcp_metadata, "TensorProperties"):
    _TENSOR_PROPERTIES: Any = _dcp_metadata.TensorProperties
    _MEM_FORMAT_ENCODING: Any = _dcp_metadata._MEM_FORMAT_ENCODING
else:  # pragma: no cover - PyTorch < 2.3
    from torch.distributed._shard.sharded_tensor import metadata as _sharded_metadata

    _TENSOR_PROPERTIES = _sharded_metadata.TensorProperties
    _MEM_FORMAT_ENCODING = _sharded_metadata.MEM_FORMAT_ENCODING

_SHARDED_TENSOR_MODULE = "torch.distributed._shard.sharded_tensor.metadata"
_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"

# Every global the engine's metadata encoder writes (src/format/metadata_encoder.cc), and what
# it resolves to here. Nothing else is resolved.
_ENGINE_GLOBALS: Dict[Tuple[str, str], Any] = {
    (_DCP_METADATA_MODULE, "Metadata"): _dcp_metadata.Metadata,
    (_DCP_METADATA_MODULE, "TensorStorageMetadata"): _dcp_metadata.TensorStorageMetadata,
    (_DCP_METADATA_MODULE, "BytesStorageMetadata"): _dcp_metadata.BytesStorageMetadata,
    (_DCP_METADATA_MODULE, "ChunkStorageMetadata"): _dcp_metadata.ChunkStorageMetadata,
    (_DCP_METADATA_MODULE, "MetadataIndex"): _dcp_metadata.MetadataIndex,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _dcp_filesystem._StorageInfo,
    (_SHARDED_TENSOR_MODULE, "TensorProperties"): _TENSOR_PROPERTIES,
    (_SHARDED_TENSOR_MODULE, "MEM_FORMAT_ENCODING"): _MEM_FORMAT_ENCODING,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): lambda name: {"torch.strided": torch.strided}[name],
}


class _EngineMetadataUnpickler(pickle.Unpickler):
    """Unpickles the engine's re-encoded metadata: resolves only _ENGINE_GLOBALS and torch
    dtypes. The engine writes nothing else; anything else means a bug, never a checkpoint."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ENGINE_GLOBALS.get((module, name))
        if found is not None:
            return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise errors.InternalError(f"the engine's metadata pickle names {module}.{name}, which it never writes")

    def persistent_load(self, pid: Any) -> Any:
        raise errors.InternalError("the engine's metadata pickle holds a persistent id, which it never writes")


def metadata_from_engine(rebuilt: bytes, source_name: str) -> Metadata:
    """The DCP Metadata whose engine re-encoding (``sp_reader_metadata_rebuilt`` /
    ``sp_metadata_rebuild``) is ``rebuilt``; ``source_name`` names the ``.metadata`` in errors."""
    try:
        metadata = _EngineMetadataUnpickler(io.BytesIO(rebuilt)).load()
    except errors.ShardpointError:
        raise
    except Exception as e:  # a broken re-encoding is an engine bug
        raise errors.InternalError(f"{source_name}: the engine's metadata pickle does not load: {e}") from e
    if not isinstance(metadata, Metadata):
        raise errors.InternalError(f"{source_name}: the engine's metadata pickle holds a {type(metadata).__name__}")
    return metadata


_GLOBAL_IN_MESSAGE = re.compile(r"(?:GLOBAL|global) ([\w.]+)")


def screen_bytes_item(blob: bytes, fqn: str, where: str) -> None:
    """Loads the bytes item ``fqn`` of checkpoint ``where`` with ``torch.load(weights_only=True)``
    (PyTorch's allowlist plus the user's safe globals), so that the planner's own
    unrestricted ``torch.load`` that follows runs nothing a checkpoint names.
    Raises FormatError naming the item and the refused global."""
    try:
        torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:
        text = str(e)
        found = _GLOBAL_IN_MESSAGE.search(text)
        reason = f"it names {found.group(1)}" if found else text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise errors.FormatError(
            f'{where}: bytes item "{fqn}": refused by torch.load(weights_only=True): {reason} (allow a class with '
            "torch.serialization.add_safe_globals, or pass trusted=True for a checkpoint you trust)"
        ) from None


def weights_only_default(weights_only: Optional[bool]) -> bool:
    """``weights_only`` for ``torch.load`` of a checkpoint file: True unless the caller says False."""
    return True if weights_only is None else bool(weights_only)



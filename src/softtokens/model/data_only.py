"""Checkpoints are data: weights in safetensors, settings and tokenizers in JSON, nothing that runs code when read.

Why: a checkpoint whose weights file was a pickle that runs code on load, its manifest and record rehashed, passed
the project's own checks; only transformers' `weights_only` default stopped it. So every file of a checkpoint is held
to a data-only format here, by its bytes, before anything opens it (``data_only_problem``): safetensors (an 8-byte
header length and a JSON header), JSON and tokenizer text; a pickle, a zip (torch.save) or any other binary is
refused, naming the file. The resume state's optimizer is a torch.distributed.checkpoint directory, whose metadata
is pickled by torch itself: it is read with an unpickler that can build only DCP's own metadata types and torch's
dtypes and sizes (``SafeReader``), and its non-tensor entries with ``torch.load(weights_only=True)``
(``SafePlanner``); a global outside that list stops the load before anything is built from it. The learning-rate
schedule is JSON (train.saving)."""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path

# the first bytes of what runs code on load: a pickle (protocol 2 to 5) and a zip (torch.save's format)
PICKLE_MAGIC = tuple(bytes([0x80, p]) for p in range(2, 6))
ZIP_MAGIC = b"PK\x03\x04"
TEXT_SUFFIXES = (".json", ".txt", ".jinja", ".md")          # tokenizer and config files, read as text
DCP_METADATA = ".metadata"                                   # the resume state's optimizer: DCP's metadata (a pickle)
SENTENCEPIECE = ".model"                                     # a SentencePiece model: protobuf, no code


def _head(path: Path, n: int = 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def safetensors_problem(path: Path) -> str | None:
    """Whether ``path`` is laid out as safetensors: a little-endian 8-byte header length, then that many bytes of
    JSON object (None: it is)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return f"{path} is not safetensors ({size} bytes)"
    n = int.from_bytes(head[:8], "little")
    if n < 2 or 8 + n > size or head[8:9] != b"{":
        return f"{path} is not safetensors (its header does not open a JSON object of {n} bytes)"
    return None


def file_problem(path: Path, dcp: bool = False) -> str | None:
    """Why one file of a checkpoint is not data-only (None: it is). ``dcp``: a resume state's optimizer directory,
    whose files SafeReader and SafePlanner read."""
    head = _head(path)
    if dcp and path.name == DCP_METADATA:   # torch's own pickle: read by the restricted unpickler, here first
        try:
            read_dcp_metadata(path)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            return str(err) if isinstance(err, UnsafePickle) else f"{path} is no DCP metadata ({err})"
        return None
    if dcp and path.suffix == ".distcp":   # torch.save'd entries, every one read with weights_only (SafePlanner)
        return None
    if head.startswith(PICKLE_MAGIC):
        return f"{path} is a pickle: it could run code when loaded, and a checkpoint holds data only"
    if head.startswith(ZIP_MAGIC):
        return f"{path} is a zip archive (torch.save's format, a pickle inside): a checkpoint holds data only"
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    if path.suffix in TEXT_SUFFIXES or path.suffix == SENTENCEPIECE:
        return None
    return (f"{path}: a {path.suffix or 'suffix-less'} file is none of a checkpoint's data-only formats "
            f"(safetensors, JSON, tokenizer text): refused before it is opened")


def data_only_problem(checkpoint: str | Path) -> str | None:
    """The first file of a checkpoint directory that is not data-only (module docstring), None when all are. The
    provenance record and Snakemake's marker are JSON and text; an optimizer/ directory is the resume state's."""
    checkpoint = Path(checkpoint)
    for f in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        rel = f.relative_to(checkpoint)
        problem = file_problem(f, dcp=rel.parts[0] == "optimizer")
        if problem:
            return problem
    return None


# ---------------------------------------------------------------- the resume state's optimizer (DCP)
def _metadata_types() -> dict[tuple[str, str], object]:
    """What DCP's pickled metadata may build: its own metadata dataclasses and enums, its file system's storage
    record, torch's Size, dtypes and layouts, and a path."""
    import pathlib

    import torch
    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md
    import torch.serialization as ser

    allowed = {("torch", "Size"): torch.Size, ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): fs._StorageInfo,
               ("torch.serialization", "_get_layout"): ser._get_layout, ("pathlib", "PosixPath"): pathlib.PosixPath,
               ("pathlib", "PurePosixPath"): pathlib.PurePosixPath}
    for name in dir(md):
        obj = getattr(md, name)
        if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
            allowed[("torch.distributed.checkpoint.metadata", name)] = obj
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class UnsafePickle(pickle.UnpicklingError):
    """A pickle that asks for something outside the allowed types: nothing was built from it."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file)
        self.allowed = _metadata_types()
        self.source = source

    def find_class(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise UnsafePickle(f"{self.source} asks to build {module}.{name}, which is no part of an optimizer "
                               "checkpoint's metadata: refused, nothing was built from it") from None


def read_dcp_metadata(path: str | Path):
    """DCP's metadata file read as data only (UnsafePickle naming the file and the global otherwise)."""
    with open(path, "rb") as f:
        return _MetadataUnpickler(f, str(path)).load()


def safe_reader(path: str | Path):
    """A torch.distributed.checkpoint reader of ``path`` whose metadata is read by read_dcp_metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            metadata = read_dcp_metadata(self._get_metadata_path(rank))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def safe_planner():
    """DCP's default load planner, its non-tensor entries (a learning rate, a step count) read with
    ``torch.load(weights_only=True)``: torch's own data-only unpickler."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner()

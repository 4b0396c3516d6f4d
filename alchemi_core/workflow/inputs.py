"""Structures for a workflow: files ASE reads (a file, a glob, a directory) or an alchemi Zarr store.

Each structure read from files keeps its source: ``info["source_file"]`` (the path as given)
and ``info["source_index"]`` (the frame in that file), stored as the system fields
``infotext_source_file`` and ``info_source_index`` and written back by ``to_atoms`` and exports.

Example:
    >>> import os, tempfile
    >>> from ase.build import bulk
    >>> import ase.io
    >>> from alchemi_core.workflow.inputs import read_structures
    >>> folder = tempfile.mkdtemp()
    >>> ase.io.write(os.path.join(folder, "ar.extxyz"), [bulk("Ar", "fcc", a=5.26, cubic=True)] * 2)
    >>> structures = read_structures(folder)
    >>> len(structures), structures[1].to_atoms().info["source_index"]
    (2, 1)
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import torch

from alchemi_core.data import AtomicData
from alchemi_core.data.ase_io import TEXT_PREFIX, encode_text, fields_from_atoms, harmonise
from alchemi_core.errors import InvalidDataError

SOURCE_FILE = TEXT_PREFIX + "source_file"
SOURCE_INDEX = "info_source_index"


def is_zarr_store(path: str) -> bool:
    """Whether ``path`` names an alchemi/Zarr store rather than structure files."""
    if "://" in path:
        return True
    p = Path(path)
    return p.suffix == ".zarr" or (p.is_dir() and (p / "zarr.json").exists())


def input_files(path: str) -> list[str]:
    """The files ``path`` names: itself, the matches of a glob, or a directory's files, sorted.

    Raises:
        InvalidDataError: Nothing there.
    """
    if any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        if not files:
            raise InvalidDataError(f"input.path {path!r} matches no files; check the pattern and the working directory")
        return files
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise InvalidDataError(f"input.path {path!r} is an empty directory; put structure files in it")
        return files
    if p.is_file():
        return [str(p)]
    raise InvalidDataError(f"input.path {path!r} does not exist; give a file, a glob, a directory or a Zarr store")


def read_structures(
    path: str, format: str | None = None, index: str = ":", dtype: torch.dtype = torch.float32
) -> list[AtomicData]:
    """Every structure in the files ``path`` names, with its source (see the module docstring).

    Raises:
        InvalidDataError: No files, a file ASE cannot read, or a structure alchemi cannot hold
            (a constraint it cannot honour, an ``info`` value of another type).
    """
    import ase.io

    converted: list[tuple[dict[str, Any], dict[str, str]]] = []
    for file in input_files(path):
        try:
            frames = ase.io.read(file, index=index, format=format)
        except Exception as exc:  # noqa: BLE001 - ASE raises many kinds; the user needs the file named
            raise InvalidDataError(
                f"cannot read {file!r} with ASE ({type(exc).__name__}: {exc}); set input.format to its ASE "
                "format or remove the file from input.path"
            ) from None
        frames = frames if isinstance(frames, list) else [frames]
        for i, atoms in enumerate(frames):
            try:
                fields, levels = fields_from_atoms(atoms, dtype)
            except InvalidDataError as exc:
                raise InvalidDataError(f"{file}, frame {i}: {exc}") from None
            fields[SOURCE_FILE] = encode_text(file, "source_file").unsqueeze(0)
            fields[SOURCE_INDEX] = torch.tensor([i], dtype=torch.long)
            levels[SOURCE_FILE] = levels[SOURCE_INDEX] = "system"
            converted.append((fields, levels))
    if not converted:
        raise InvalidDataError(f"input.path {path!r} holds no structures")
    harmonise([f for f, _ in converted])
    return [AtomicData(levels=lv, **f) for f, lv in converted]


def open_dataset(path: str, format: str | None = None, index: str = ":", dtype: str = "float32") -> Any:
    """A dataset for ``SizeAwareSampler``: a Zarr store's reader, or the files' structures in memory."""
    from alchemi_core.data.datapipes import ListDataset

    if is_zarr_store(path):
        from alchemi_core import registry

        reader_cls = registry.resolve_export("alchemi_core.data.datapipes", "AtomicDataZarrReader")
        return reader_cls(path)
    return ListDataset(read_structures(path, format, index, getattr(torch, dtype)))

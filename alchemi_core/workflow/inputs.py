"""Structures for a workflow: files ASE reads (a file, a glob, a directory) or an alchemi Zarr store.

Each structure read from files keeps its source in ``info["source_file"]`` and
``info["source_index"]`` (the frame in that file).

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
from alchemi_core.data.datapipes import ListDataset, ReaderDataset, as_atomic_data
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


def open_dataset(
    path: str, format: str | None = None, index: str = ":", dtype: str = "float32", resume_status: bool = False,
    stages: int | None = None,
) -> Any:
    """A dataset for ``SizeAwareSampler``: a Zarr store's structures (:class:`StoreInput`), or the
    files' structures in memory.

    Raises:
        WorkflowError: With ``resume_status``, structures whose status names no stage of a
            workflow of ``stages`` stages.
    """
    if is_zarr_store(path):
        from alchemi_core import registry

        reader_cls = registry.resolve_export("alchemi_core.data.datapipes", "AtomicDataZarrReader")
        return StoreInput(reader_cls(path), resume_status, stages)
    return ListDataset(read_structures(path, format, index, getattr(torch, dtype)))


class StoreInput(ReaderDataset):
    """The structures of a results store as a workflow's input: each starts at the first stage
    (``status`` 0), or with ``resume_status`` at the stage its stored status names (a status that
    names no stage of the workflow is then an error naming the structures).

    Args:
        reader: ``len``, ``reader[i]``, ``get_metadata(i)`` (an ``AtomicDataZarrReader``).
        resume_status: Keep the stored statuses.
        stages: The workflow's number of stages (for ``resume_status``; None: not checked).

    Raises:
        WorkflowError: With ``resume_status``, statuses that name no stage (key ``input.resume_status``).
    """

    def __init__(self, reader: Any, resume_status: bool = False, stages: int | None = None) -> None:
        self.reader = reader
        self.resume_status = bool(resume_status)
        if self.resume_status and stages is not None:
            self._check_statuses(stages)

    def _check_statuses(self, stages: int) -> None:
        import numpy as np

        from alchemi_core.workflow.spec import WorkflowError

        status = self._statuses()
        bad = np.nonzero((status < 0) | (status >= stages))[0]
        if len(bad):
            shown = ", ".join(f"{int(i)} (status {int(status[i])})" for i in bad[:5])
            raise WorkflowError(
                "input.resume_status",
                f"with resume_status = true each structure continues at the stage its stored status names, "
                f"but {len(bad)} of {len(status)} structures have a status that names none of this workflow's "
                f"{stages} stages (0 to {stages - 1}): structures {shown}{', ...' if len(bad) > 5 else ''} "
                "(finished, or quarantined when negative); remove resume_status to run every structure from "
                "the first stage"
            )

    def _statuses(self) -> Any:
        """Every structure's stored status (0 where it has none), one read of that field."""
        import numpy as np

        n = len(self)
        if "status" in getattr(self.reader, "fields", {}):
            return np.asarray(self.reader.store.read_rows("status", 0, n)).reshape(n, -1)[:, 0].astype(np.int64)
        return np.asarray([int(self.reader[i].get("status", torch.zeros(1)).reshape(-1)[0]) for i in range(n)],
                          dtype=np.int64)

    def __getitem__(self, index: int) -> Any:
        data = as_atomic_data(self.reader[index], index)
        if not self.resume_status and "status" in data:
            data.status = torch.zeros_like(data.status)
        return data

    def __repr__(self) -> str:
        return f"StoreInput({self.reader!r}, resume_status={self.resume_status})"

"""One log file for every stage of a run, and loading it back as a table.

Each stage gets a ``hook:logging`` whose rows go to one CSV file with the columns
:data:`COLUMNS`: ``time`` in fs, energies in eV, ``fmax`` in eV/Å, ``temperature`` in K,
``wall_s`` seconds since the run started, and for stages that compute stress (NPT, a cell filter)
``volume`` in Å³ and the instantaneous ``pressure`` in eV/Å³ (empty for the others).

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from alchemi_core.workflow.logs import LogCollector, read_log
    >>> path = os.path.join(tempfile.mkdtemp(), "run.log.csv")
    >>> log = LogCollector(path)
    >>> log.receive(0, {"step": np.array([0]), "system_id": np.array([4]), "energy": np.array([-1.0])})
    >>> log.close()
    >>> table = read_log(path)
    >>> int(table["system_id"][0]), float(table["energy"][0])
    (4, -1.0)
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

#: Columns of the file, in order (missing ones are left empty).
COLUMNS = ("step", "stage", "system_id", "status", "time", "energy", "kinetic_energy", "total_energy", "fmax",
           "temperature", "wall_s", "stage_name", "volume", "pressure")
_INTEGER = frozenset({"step", "stage", "system_id", "status"})


class LogCollector:
    """Rows from several stages' ``LoggingHook`` writers into one CSV file.

    Args:
        path: The file (replaced unless ``append``).
        frequency: Steps between logged rows of each stage.
        append: Add to an existing log (a run appending to a store).
    """

    def __init__(self, path: str | os.PathLike[str], frequency: int = 10, append: bool = False) -> None:
        self.path = Path(path)
        self.frequency = int(frequency)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Open for the collector's life (closed by close()), as rows arrive from several threads.
        self._file: IO[str] | None = open(self.path, "a" if append else "w", encoding="utf-8", newline="")  # noqa: SIM115
        if not append:
            self._file.write(",".join(COLUMNS) + "\n")
            self._file.flush()
        self._start = time.perf_counter()
        self._hooks: list[Any] = []
        self._names: dict[int, str] = {}

    def hook(self, stage_index: int, stage: Any = None) -> Any:
        """A ``hook:logging`` whose rows come here, labelled ``stage_index`` and the name of
        ``stage`` (its ``name``, e.g. ``FIRE``)."""
        from alchemi_core import registry

        if stage is not None:
            self.name_stage(stage_index, str(getattr(stage, "name", None) or type(stage).__name__))
        h = registry.build("hook:logging", frequency=self.frequency,
                           writer=lambda columns: self.receive(stage_index, columns))
        self._hooks.append(h)
        return h

    def name_stage(self, stage_index: int, name: str) -> None:
        """Write ``name`` in the ``stage_name`` column of stage ``stage_index``'s rows."""
        # A CSV cell: no separators or line breaks inside.
        self._names[stage_index] = "".join(c if c.isprintable() and c not in ',"' else " " for c in name)

    def receive(self, stage_index: int, columns: dict[str, np.ndarray]) -> None:
        """Append one logged step's rows (called on a hook's background thread)."""
        n = len(next(iter(columns.values()))) if columns else 0
        wall = time.perf_counter() - self._start
        cols = dict(columns)
        cols["stage"] = np.full(n, stage_index)
        cols["wall_s"] = np.full(n, wall)
        name = self._names.get(stage_index, "")
        lines = []
        for i in range(n):
            cells = []
            for c in COLUMNS:
                v = cols.get(c)
                if c == "stage_name":
                    cells.append(name)
                elif v is None:
                    cells.append("")
                elif c in _INTEGER:
                    cells.append(str(int(v[i])))
                else:
                    cells.append(repr(float(v[i])))
            lines.append(",".join(cells))
        with self._lock:
            if self._file is not None and lines:
                self._file.write("\n".join(lines) + "\n")
                # Each logged step reaches the file at once: a run that is killed keeps its log.
                self._file.flush()

    def close(self) -> None:
        """Flush every hook's pending rows and close the file."""
        for h in self._hooks:
            h.close()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_log(path: str | os.PathLike[str]) -> Any:
    """A log file as a table: a ``pandas.DataFrame`` when pandas is installed, else a dict of numpy
    columns keyed by the column names (empty cells are NaN)."""
    data = np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8", ndmin=1)
    columns = {name: np.atleast_1d(np.asarray(data[name])) for name in data.dtype.names or ()}
    try:
        import pandas
    except ImportError:
        return columns
    return pandas.DataFrame(columns)

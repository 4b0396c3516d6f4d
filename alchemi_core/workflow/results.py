"""Getting results out of a store: a summary, a per-structure table, exports and plots.

A structure (one ``system_id``) has one record per stored frame: its final state, and trajectory
frames when the run stored them; its last record is its result. A record is known by its
``system_id``, ``status`` and ``stage_steps``: two records alike in all three are a structure
stored twice, which these functions refuse rather than pick one. A sharded store (a
data-parallel run's) reads as one set.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr import ZarrData
    >>> ZarrData("memory://results-doc").write(make_batch([3, 2]))
    >>> summary = store_summary("memory://results-doc")
    >>> summary["records"], summary["structures"]
    (2, 2)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from alchemi_core.data.ase_io import EDGE_FIELDS
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.units import EV_PER_A3_TO_GPA

#: Plots :func:`plot_results` draws.
PLOTS = ("energy", "temperature", "fmax", "throughput", "pressure", "volume", "bands")
#: Export formats by file suffix.
FORMATS = {".extxyz": "extxyz", ".xyz": "extxyz", ".traj": "traj"}
#: Orders :func:`export_structures` writes structures in: by ``system_id`` (the order of the
#: input, which a run numbers from 0), or the order their last records were stored (completion).
ORDERS = ("input", "stored")
#: The fields that tell a structure's records apart (see the module docstring).
RECORD_IDENTITY = ("system_id", "status", "stage_steps")


def open_store(path: Any) -> Any:
    """An ``AtomicDataZarrReader`` over the store at ``path`` (needs alchemi-zarr); for the root
    of a sharded store (a data-parallel run's), a ``ShardedZarrReader`` over all its parts.

    Raises:
        InvalidDataError: No alchemi store there.
    """
    from alchemi_core import registry

    if isinstance(path, (str, os.PathLike)) and "://" not in str(path) and not Path(path).exists():
        raise InvalidDataError(f"no results store at {str(path)!r}; give the path of a .zarr store a run wrote")
    if not isinstance(path, (str, os.PathLike)):  # a reader already
        return path
    return registry.resolve_export("alchemi_core.data.datapipes", "open_results_reader")(path)


def _column(reader: Any, name: str) -> np.ndarray | None:
    if name not in reader.fields:
        return None
    return np.asarray(reader.column(name))


def _structure_ids(reader: Any) -> np.ndarray | None:
    """Every record's ``system_id`` (None without the field), once the store is known to hold no
    structure twice.

    Raises:
        InvalidDataError: A structure whose last record is stored twice (the same ``system_id``,
            ``status`` and ``stage_steps``).
    """
    from alchemi_core import registry

    ids = _column(reader, "system_id")
    if ids is None or "status" not in reader.fields:  # not a run's results: no claim on repeats
        return ids
    check_unique = registry.resolve_export("alchemi_core.data.datapipes", "check_unique_results")
    check_unique({k: _column(reader, k) for k in RECORD_IDENTITY if k in reader.fields}, 0, reader.where)
    return ids


def last_records(reader: Any) -> np.ndarray:
    """Index of each structure's last record, in order of first appearance."""
    ids = _structure_ids(reader)
    if ids is None:
        return np.arange(len(reader))
    last: dict[int, int] = {}
    for i, sid in enumerate(ids.reshape(-1).tolist()):
        last[sid] = i
    return np.fromiter(last.values(), dtype=np.int64, count=len(last))


def structure_table(store: Any) -> list[dict[str, Any]]:
    """One row per structure: id, source, atoms, frames, status, energy (eV and eV/atom), fmax (eV/Å)."""
    from alchemi_core.data.ase_io import decode_text

    reader = open_store(store)
    n = len(reader)
    if n == 0:
        return []
    atoms = reader.get_all_metadata()[0]
    ids = _column(reader, "system_id")
    frames = np.bincount(np.unique(ids, return_inverse=True)[1]) if ids is not None else np.ones(n, np.int64)
    order = {sid: k for k, sid in enumerate(dict.fromkeys(ids.tolist()))} if ids is not None else {}
    cols = {name: _column(reader, name) for name in ("status", "energy", "fmax", "info_source_index",
                                                    "infotext_source_file")}
    rows = []
    for i in last_records(reader).tolist():
        row: dict[str, Any] = {"system_id": int(ids[i]) if ids is not None else i, "record": i,
                               "atoms": int(atoms[i])}
        row["frames"] = int(frames[order[int(ids[i])]]) if ids is not None else 1
        if cols["infotext_source_file"] is not None:
            row["source_file"] = decode_text(cols["infotext_source_file"][i])
        if cols["info_source_index"] is not None:
            row["source_index"] = int(np.asarray(cols["info_source_index"][i]).reshape(-1)[0])
        if cols["status"] is not None:
            row["status"] = int(cols["status"][i])
        if cols["energy"] is not None:
            e = float(np.asarray(cols["energy"][i]).reshape(-1)[0])
            row["energy_eV"] = e
            row["energy_per_atom_eV"] = e / max(int(atoms[i]), 1)
        if cols["fmax"] is not None:
            row["fmax_eV_per_A"] = float(cols["fmax"][i])
        rows.append(row)
    return rows


def store_summary(store: Any) -> dict[str, Any]:
    """Records, structures, atoms, fields and statuses of a store, and its final energies."""
    reader = open_store(store)
    table = structure_table(reader)
    statuses: dict[str, int] = {}
    for r in table:
        if "status" in r:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    energies = np.array([r["energy_per_atom_eV"] for r in table if "energy_per_atom_eV" in r])
    out: dict[str, Any] = {
        "store": str(reader.where),
        "records": len(reader),
        "structures": len(table),
        "atoms": int(sum(r["atoms"] for r in table)),
        "fields": sorted(reader.fields),
        "final_status_counts": statuses,
    }
    if len(energies):
        out["energy_per_atom_eV"] = {"mean": float(energies.mean()), "min": float(energies.min()),
                                     "max": float(energies.max())}
    return out


def export_structures(store: Any, out: str | os.PathLike[str], frames: str = "last", format: str | None = None,
                      order: str = "input") -> int:
    """Write structures of ``store`` to ``out`` (replaced): each structure's last frame, or every
    frame (``frames="all"``, grouped by structure, in the order stored). Quarantined records
    (negative status) are not written; :func:`quarantined_ids` names their structures.

    Args:
        store: A results store (path, URL or reader; the root of a sharded store reads as one set).
        out: An ``.extxyz``/``.xyz`` file (extended XYZ) or ``.traj`` (ASE trajectory).
        frames: ``"last"`` or ``"all"``.
        format: ``"extxyz"`` or ``"traj"`` (default: from the suffix of ``out``).
        order: ``"input"``: structures by ``system_id``, the order of the run's input;
            ``"stored"``: in the order their last records were stored (the order they finished).

    Returns:
        Frames written.

    Raises:
        ConfigurationError: An unknown format, ``frames`` or ``order`` value.
        InvalidDataError: The store holds a structure twice (see the module docstring).
    """
    import ase.io

    reader = open_store(store)
    fmt = format or FORMATS.get(Path(out).suffix.lower())
    if fmt not in ("extxyz", "traj"):
        raise ConfigurationError(
            f"cannot tell the export format of {str(out)!r}; name it .extxyz, .xyz or .traj, or pass --format"
        )
    if frames not in ("last", "all"):
        raise ConfigurationError(f"frames must be 'last' or 'all', got {frames!r}")
    if order not in ORDERS:
        raise ConfigurationError(f"order must be one of {list(ORDERS)}, got {order!r}")
    indices = _export_order(reader, frames, order)
    status = _column(reader, "status")
    if status is not None:
        indices = [i for i in indices if status.reshape(-1)[i] >= 0]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).unlink(missing_ok=True)
    if fmt == "traj":
        from ase.io.trajectory import Trajectory

        with Trajectory(str(out), "w") as traj:
            for i in indices:
                traj.write(reader[i].to_atoms(exclude=EDGE_FIELDS))
        return len(indices)
    block = 512
    for lo in range(0, len(indices), block):
        chunk = [reader[i].to_atoms(exclude=EDGE_FIELDS) for i in indices[lo:lo + block]]
        ase.io.write(str(out), chunk, format="extxyz", append=lo > 0)
    return len(indices)


def quarantined_ids(store: Any) -> list[int]:
    """``system_id`` of each structure whose last record is quarantined (negative status)."""
    reader = open_store(store)
    status, ids = _column(reader, "status"), _column(reader, "system_id")
    if status is None or ids is None:
        return []
    last = last_records(reader)
    return sorted(int(ids.reshape(-1)[i]) for i in last if status.reshape(-1)[i] < 0)


def _export_order(reader: Any, frames: str, order: str) -> list[int]:
    """The records to export, in the order to write them."""
    last = last_records(reader)
    ids = _column(reader, "system_id")
    if ids is None:
        return last.tolist()
    ids = ids.reshape(-1)
    # Structures in the order asked: by id, or by where their last record lies.
    chosen = last[np.argsort(ids[last], kind="stable")] if order == "input" else np.sort(last)
    if frames == "last":
        return chosen.tolist()
    by_id = np.argsort(ids[chosen], kind="stable")  # positions in `chosen`, by id
    record_rank = by_id[np.searchsorted(ids[chosen][by_id], ids)]  # each record's structure's position
    return np.lexsort((np.arange(len(ids)), record_rank)).tolist()


def plot_results(store: Any, outdir: str | os.PathLike[str], kinds: Sequence[str] = PLOTS,
                 log: str | os.PathLike[str] | None = None) -> list[Path]:
    """PNG plots with labelled axes, one per kind in ``kinds``, into ``outdir``: from the run's log
    (``log``, default ``<store>.log.csv``) each stage's values over time and the throughput, and
    pressure (GPa) and volume per atom where the log has them (stages with stress: NPT, cell
    filters); without a log, histograms of the stored final energy per atom and fmax; and the
    energy profile of each nudged elastic band where the store holds bands (``bands``).

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    from alchemi_core.errors import MissingDependencyError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("plots need matplotlib: pip install matplotlib (or alchemi-core[plot])") from None
    from alchemi_core.workflow.logs import read_log
    from alchemi_core.workflow.run import log_path_for

    for k in kinds:
        if k not in PLOTS:
            raise ConfigurationError(f"unknown plot {k!r}; choose from {list(PLOTS)}")
    reader = open_store(store)
    if log is None and isinstance(store, (str, os.PathLike)) and log_path_for(str(store)).exists():
        log = log_path_for(str(store))
    table = read_log(log) if log is not None else None
    cols = {k: np.asarray(table[k]) for k in table} if table is not None else None
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ids = _column(reader, "system_id")
    atoms = {} if ids is None else dict(zip(ids.tolist(), reader.get_all_metadata()[0].tolist(), strict=True))
    for kind in kinds:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        drawn = _draw(ax, kind, cols, reader, atoms)
        if not drawn:
            plt.close(fig)
            continue
        fig.tight_layout()
        path = outdir / f"{kind}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


_LABELS = {
    "energy": ("potential energy per atom (eV/atom)", "energy"),
    "temperature": ("temperature (K)", "temperature"),
    "fmax": ("largest atomic force, fmax (eV/Å)", "fmax"),
    "pressure": ("instantaneous pressure (GPa)", "pressure"),
    "volume": ("volume per atom (Å³/atom)", "volume"),
}


def _draw(ax: Any, kind: str, cols: dict[str, np.ndarray] | None, reader: Any, atoms: dict[int, int]) -> bool:
    if kind == "bands":
        return _draw_bands(ax, reader)
    if cols is not None and len(cols.get("step", ())):
        if kind == "throughput":
            return _draw_throughput(ax, cols)
        ylabel, column = _LABELS[kind]
        # An all-empty column reads back as bools (numpy's genfromtxt): nothing logged there.
        if column not in cols or np.asarray(cols[column]).dtype == bool:
            return False
        values = np.asarray(cols[column], dtype=float)
        if kind in ("pressure", "volume"):
            # Only stages with stress log these: the rows of the others are empty (NaN).
            keep = np.isfinite(values)
            if not keep.any():
                return False
            cols = {k: np.asarray(v)[keep] for k, v in cols.items()}
            values = values[keep]
        if kind in ("energy", "volume"):
            n = np.array([atoms.get(int(s), 1) for s in cols["system_id"]], dtype=float)
            values = values / n
        if kind == "pressure":
            values = values * EV_PER_A3_TO_GPA
        names = cols.get("stage_name")
        for stage in np.unique(cols["stage"]).tolist():
            sel = cols["stage"] == stage
            named = str(names[sel][0]) if names is not None and sel.any() else ""
            label = f"{named} (stage {stage})" if named and named != "nan" else f"stage {stage}"
            t, v = cols["time"][sel].astype(float), values[sel]
            grid = np.unique(t)
            mean = np.array([v[t == g].mean() for g in grid])
            lo = np.array([np.percentile(v[t == g], 10) for g in grid])
            hi = np.array([np.percentile(v[t == g], 90) for g in grid])
            line = ax.plot(grid, mean, label=f"{label}: mean")[0]
            ax.fill_between(grid, lo, hi, alpha=0.25, color=line.get_color(), label=f"{label}: 10-90 %")
        if kind == "fmax":
            ax.set_yscale("log")
        ax.set_xlabel("time in stage (fs)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{kind} per structure during the run")
        ax.legend(fontsize="small")
        return True
    # No log: the store's final values.
    if kind in ("temperature", "throughput", "pressure", "volume"):
        return False
    column = "energy" if kind == "energy" else "fmax"
    stored = _column(reader, column)
    if stored is None:
        return False
    last = last_records(reader)
    values = np.asarray(stored, dtype=float).reshape(len(reader), -1)[last, 0]
    if kind == "energy":
        values = values / np.maximum(reader.get_all_metadata()[0][last], 1)
    ax.hist(values, bins=min(30, max(5, len(values) // 3)))
    ax.set_xlabel(_LABELS[kind][0])
    ax.set_ylabel("structures")
    ax.set_title(f"final {kind} of each structure")
    return True


def _draw_bands(ax: Any, reader: Any) -> bool:
    """The energy profile of each nudged elastic band in the store (``integrator:neb``: records
    with ``neb_band`` and ``neb_image``): each image's final energy less its band's first."""
    names = [next((k for k in (n, f"info_{n}") if k in reader.fields), None) for n in ("neb_band", "neb_image")]
    if None in names or "energy" not in reader.fields:
        return False
    last = last_records(reader)
    band, image = (np.asarray(_column(reader, n)).reshape(len(reader), -1)[last, 0] for n in names)  # type: ignore[arg-type]
    energy = np.asarray(_column(reader, "energy"), dtype=float).reshape(len(reader), -1)[last, 0]
    for b in np.unique(band).tolist():
        sel = np.nonzero(band == b)[0]
        order = sel[np.argsort(image[sel], kind="stable")]
        ax.plot(image[order], energy[order] - energy[order[0]], marker="o", label=f"band {b}")
    ax.set_xlabel("image along the band")
    ax.set_ylabel("energy less the first image's (eV)")
    ax.set_title("energy profile of each band")
    if len(np.unique(band)) <= 12:
        ax.legend(fontsize="small")
    return True


def _draw_throughput(ax: Any, cols: dict[str, np.ndarray]) -> bool:
    """Engine steps per second over wall time, one line per run appended to the log (a run starts
    where the step count goes back)."""
    steps, walls = [], []
    for step in dict.fromkeys(cols["step"].tolist()):  # logged steps in file order
        steps.append(step)
        walls.append(cols["wall_s"][cols["step"] == step].min())
    step_arr, wall_arr = np.asarray(steps, dtype=float), np.asarray(walls, dtype=float)
    starts = [0, *(np.nonzero(np.diff(step_arr) < 0)[0] + 1).tolist(), len(step_arr)]
    drawn = False
    for run, (lo, hi) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        s, w = step_arr[lo:hi], np.maximum.accumulate(wall_arr[lo:hi])
        if len(s) < 3 or w[-1] <= w[0]:
            continue
        # Rows reach the host in bursts: smooth over a uniform grid of wall time.
        grid = np.linspace(w[0], w[-1], min(40, len(s)))
        rate = np.gradient(np.interp(grid, w, s), grid)
        ax.plot(grid, rate, label=f"run {run}")
        drawn = True
    if not drawn:
        return False
    ax.set_xlabel("wall time since the run started (s)")
    ax.set_ylabel("engine steps per second")
    ax.set_title("throughput")
    if len(starts) > 2:
        ax.legend(fontsize="small")
    return True

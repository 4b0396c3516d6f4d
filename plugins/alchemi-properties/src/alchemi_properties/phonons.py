"""Phonons of many crystals through phonopy in one call: ``phonons``.

Each structure gets its own :class:`phonopy.Phonopy` (phonopy's displacements, symmetry and force
constants); the displaced supercells of *all* structures are evaluated together, inflight, by
:func:`alchemi_core.evaluate` (the static stage: one model evaluation per supercell, batches sized
by the model), and each structure's forces go back to its ``Phonopy`` for
``produce_force_constants``. On request, phonopy then computes the band structure (its automatic
path through seekpath, or the paths given), the total DOS on a q-point mesh, the thermal
properties over temperatures, and draws band structure and DOS with its own plotting into a PNG.

Every displaced supercell is evaluated exactly once and its forces reach the structure it came
from. A structure that cannot be done (not periodic, phonopy refuses it, a supercell the model
cannot evaluate or whose result is not finite) comes back with ``failure`` saying why, and the
others finish; ``strict=True`` raises instead.

Units are phonopy's: force constants eV/Å², frequencies THz, DOS states/THz, free energy kJ/mol,
entropy and heat capacity J/K/mol (per mole of phonopy's primitive cell).
Masses are the ``Atoms``' own (``atoms.get_masses()``).

Example:
    >>> from ase.build import bulk
    >>> from ase.calculators.emt import EMT
    >>> from alchemi_core import registry
    >>> from alchemi_properties.phonons import phonons
    >>> model = registry.build("model:ase", EMT())
    >>> cu, al = phonons([bulk("Cu", a=3.6), bulk("Al", a=4.05)], model, supercell_matrix=[2, 2, 2],
    ...                  mesh=[9, 9, 9], temperatures=[300.0])
    >>> cu.force_constants.shape, cu.failure
    ((8, 8, 3, 3), None)
    >>> cu.thermal_properties.heat_capacity.shape
    (1,)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import numpy as np

from alchemi_core.errors import AlchemiError, ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import ase
    import torch
    from phonopy import Phonopy
    from phonopy.phonon.band_structure import BandStructure
    from phonopy.phonon.dos import TotalDos
    from phonopy.phonon.thermal_properties import ThermalProperties
    from phonopy.structure.atoms import PhonopyAtoms

_T = TypeVar("_T")

#: A supercell matrix as phonopy takes it: 3 integers (diagonal) or 3x3.
SupercellMatrix = Sequence[int] | Sequence[Sequence[int]] | np.ndarray


@attrs.frozen
class PhononResult:
    """The phonons of one structure.

    Attributes:
        index: The structure's position in the input.
        phonopy: Its ``Phonopy`` with force constants (and the band structure, mesh, DOS and
            thermal properties that were asked for); None when phonopy could not set it up.
        supercells: How many displaced supercells it had evaluated.
        plot: The band structure (and DOS) PNG, when one was asked for.
        failure: Why it could not be done; None when it was.
    """

    index: int
    phonopy: Phonopy | None
    supercells: int = 0
    plot: Path | None = None
    failure: str | None = None

    @property
    def _done(self) -> Phonopy | None:
        """The ``Phonopy`` of a structure that did not fail."""
        return self.phonopy if self.failure is None else None

    @property
    def force_constants(self) -> np.ndarray | None:
        """Supercell force constants ``[N, N, 3, 3]`` (eV/Å²), or None for a failed structure."""
        return None if (ph := self._done) is None else ph.force_constants

    @property
    def band_structure(self) -> BandStructure | None:
        """phonopy's ``BandStructure`` (``distances``, ``frequencies`` in THz, ``qpoints``)."""
        return None if (ph := self._done) is None else ph.band_structure

    @property
    def total_dos(self) -> TotalDos | None:
        """phonopy's ``TotalDos`` (``frequency_points`` in THz, ``dos``)."""
        return None if (ph := self._done) is None else ph.total_dos

    @property
    def thermal_properties(self) -> ThermalProperties | None:
        """phonopy's ``ThermalProperties`` (``temperatures``, ``free_energy``, ``entropy``,
        ``heat_capacity``)."""
        return None if (ph := self._done) is None else ph.thermal_properties


class PhononFailure(AlchemiError, RuntimeError):
    """A structure's phonons could not be computed (raised under ``strict=True``)."""


def phonons(
    structures: Sequence[ase.Atoms],
    model: Any,
    *,
    supercell_matrix: SupercellMatrix | Callable[[ase.Atoms], SupercellMatrix] | None = None,
    primitive_matrix: str | Sequence[Sequence[float]] | None = "auto",
    distance: float = 0.01,
    symprec: float = 1e-5,
    band_path: Literal["auto"] | Sequence[Sequence[Sequence[float]]] | None = None,
    band_points: int = 101,
    mesh: float | Sequence[int] | None = None,
    temperatures: Sequence[float] | None = None,
    plot_dir: str | Path | None = None,
    strict: bool = False,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    max_atoms: int | None = None,
    max_batch_size: int | None = None,
    progress: bool = False,
    workers: int = 1,
) -> list[PhononResult]:
    """Finite-displacement phonons of every structure, all displaced supercells in one batched run.

    Args:
        structures: Crystals (periodic in x, y and z), any mix of sizes and elements.
        model: An alchemi model (``registry.build("model:...")``), on the device to run on.
        supercell_matrix: phonopy's supercell matrix for every structure (3 integers or 3x3), or a
            function of the ``Atoms`` giving each its own; None: phonopy's default (the unit cell).
        primitive_matrix: phonopy's ``primitive_matrix`` (default ``"auto"``, phonopy's).
        distance: Displacement length in Å (phonopy's default, 0.01).
        symprec: phonopy's symmetry tolerance.
        band_path: ``"auto"`` for phonopy's path (seekpath's, needs ``pip install seekpath``), or
            paths, each a list of q-points (reduced coordinates) joined by straight segments.
        band_points: q-points per segment of the band path, end points included.
        mesh: q-point mesh for the DOS and thermal properties: 3 integers, or a length (Å) from
            which phonopy makes one; None: neither is computed.
        temperatures: Temperatures (K) for the thermal properties (needs ``mesh``).
        plot_dir: Folder for one PNG per structure, ``phonons-<index>.png``: phonopy's band
            structure beside its DOS (the band structure alone without ``mesh``); needs
            ``band_path`` and matplotlib.
        strict: Raise :class:`PhononFailure` at the first structure that fails, instead of
            reporting it in its result.
        dtype: Floating dtype of positions and forces (default: that of the model's floating
            parameters, else float64, which keeps the small force differences of a 0.01 Å
            displacement).
        device: Where to run (default: :func:`alchemi_core.evaluate`'s).
        max_atoms: Most atoms per batch (None: planned from the device's memory and the model).
        max_batch_size: Most supercells per batch (None: no limit).
        progress: Show a progress bar over the supercells.
        workers: Processes for phonopy's own work (symmetry, displacements, force constants, band
            structure, DOS, thermal properties, plots), which runs in Python on the CPU and, with
            the model on a GPU, takes most of the time; above 1 the structures are spread over
            that many processes (forked from a fork server that the first such call starts:
            worth it for many or large supercells).

    Returns:
        One :class:`PhononResult` per structure, in input order.

    Raises:
        ConfigurationError: No structures, or options that do not go together.
        MissingDependencyError: phonopy (or, for plots, matplotlib) is not installed.
        PhononFailure: Under ``strict=True``, a structure that failed.
    """
    from alchemi_core import evaluate

    structures = list(structures)
    _check_options(structures, band_path, mesh, temperatures, plot_dir, workers)
    if plot_dir is not None:
        Path(plot_dir).mkdir(parents=True, exist_ok=True)
    with _workers(workers, len(structures)) as pool:
        failures: dict[int, str] = {}
        built: dict[int, Phonopy] = {}
        matrices = [supercell_matrix(a) if callable(supercell_matrix) else supercell_matrix for a in structures]
        set_up = _map(_set_up, [(a, m, primitive_matrix, distance, symprec) for a, m in zip(structures, matrices)],
                      pool)
        for i, ph_or_reason in enumerate(set_up):
            if isinstance(ph_or_reason, str):
                _fail(failures, i, ph_or_reason, strict)
            else:
                built[i] = ph_or_reason
        # One flat list of every displaced supercell of every structure; owners[k] says whose it is.
        displaced = {i: ph.supercells_with_displacements or [] for i, ph in built.items()}
        owners = [i for i, cells in displaced.items() for _ in cells]
        supercells = [_to_ase(sc) for cells in displaced.values() for sc in cells]
        done = evaluate(supercells, model, dtype=dtype or _dtype_of(model), device=device, max_atoms=max_atoms,
                        max_batch_size=max_batch_size, progress=progress) if supercells else []
        forces: dict[int, list[np.ndarray]] = {i: [] for i in built}
        for i, result in zip(owners, done, strict=True):
            reason = result.info.get("quarantine")
            if reason is not None and i not in failures:
                _fail(failures, i, f"displaced supercell {len(forces[i])}: {reason}", strict)
            forces[i].append(np.zeros((len(result), 3)) if reason is not None else result.get_forces())
        todo = [i for i in built if i not in failures]
        plots = {i: None if plot_dir is None else Path(plot_dir) / f"phonons-{i}.png" for i in todo}
        finished = _map(_finish, [(built[i], np.asarray(forces[i]), band_path, band_points, mesh, temperatures, plots[i])
                                  for i in todo], pool)
        drawn: dict[int, Path | None] = {}
        for i, out in zip(todo, finished, strict=True):
            if isinstance(out, str):
                _fail(failures, i, out, strict)
            else:
                built[i], drawn[i] = out  # from a worker process: a copy of the Phonopy sent
        return [PhononResult(i, built.get(i), len(forces.get(i, ())), drawn.get(i), failures.get(i))
                for i in range(len(structures))]


def _check_options(structures: list[ase.Atoms], band_path: object, mesh: object, temperatures: object,
                   plot_dir: object, workers: int) -> None:
    """Raise ConfigurationError for options that cannot work together, before any work."""
    if not structures:
        raise ConfigurationError("phonons: no structures given; pass a list of ase.Atoms")
    if workers < 1:
        raise ConfigurationError(f"phonons: workers is a number of processes, at least 1, not {workers}")
    if temperatures is not None and mesh is None:
        raise ConfigurationError("phonons: thermal properties need a q-point mesh; pass mesh=[n, n, n] too")
    if plot_dir is not None and band_path is None:
        raise ConfigurationError("phonons: a plot draws the band structure; pass band_path='auto' (or paths)")
    if isinstance(band_path, str) and band_path != "auto":
        raise ConfigurationError(f"phonons: band_path is 'auto' or a list of paths, not {band_path!r}")
    _phonopy()
    if band_path == "auto":
        _require("seekpath", "band_path='auto'")
    if plot_dir is not None:
        _require("matplotlib", "plot_dir")


def _workers(workers: int, structures: int) -> AbstractContextManager[Executor | None]:
    """A pool of ``workers`` processes for phonopy's work, or None for this process alone. Forked from
    a fork server (a fresh process, started once): a fork of this process, which may hold a GPU
    context or Warp's threads, is not safe, and a spawned worker would import everything again."""
    if workers == 1 or structures < 2:
        return nullcontext()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(min(workers, structures), mp_context=multiprocessing.get_context("forkserver"))


def _map(function: Callable[..., _T], calls: list[tuple[Any, ...]], pool: Executor | None) -> list[_T]:
    """``[function(*call) for call in calls]``, in ``pool`` where there is one."""
    if pool is None or not calls:
        return [function(*call) for call in calls]
    return list(pool.map(function, *zip(*calls, strict=True)))


def _set_up(atoms: ase.Atoms, supercell_matrix: SupercellMatrix | None, primitive_matrix: Any, distance: float,
            symprec: float) -> Phonopy | str:
    """``atoms``' ``Phonopy`` with its displacements, or why phonopy could not make them."""
    try:
        return _displaced(atoms, supercell_matrix, primitive_matrix, distance, symprec)
    except Exception as exc:  # phonopy and spglib raise many kinds; the structure fails, not the call
        return f"phonopy could not set it up: {exc}"


def _finish(ph: Phonopy, forces: np.ndarray, band_path: Any, band_points: int, mesh: Any,
            temperatures: Sequence[float] | None, plot: Path | None) -> tuple[Phonopy, Path | None] | str:
    """``ph`` with its force constants and what was asked, and its plot; or why phonopy failed."""
    try:
        return ph, _properties(ph, forces, band_path, band_points, mesh, temperatures, plot)
    except Exception as exc:  # as in _set_up: one structure's phonopy error is that structure's
        return f"phonopy failed on its forces: {exc}"


def _displaced(atoms: ase.Atoms, supercell_matrix: SupercellMatrix | None, primitive_matrix: Any,
               distance: float, symprec: float) -> Phonopy:
    """``atoms``' ``Phonopy`` with its displacements generated."""
    from phonopy.structure.atoms import PhonopyAtoms

    if not atoms.pbc.all() or atoms.cell.rank < 3:
        raise ValueError(f"needs a crystal, periodic in x, y and z with a 3-D cell (pbc={atoms.pbc.tolist()})")
    unitcell = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=np.asarray(atoms.cell),
                            scaled_positions=atoms.get_scaled_positions(), masses=atoms.get_masses())
    ph = _phonopy()(unitcell, supercell_matrix=supercell_matrix, primitive_matrix=primitive_matrix,
                    symprec=symprec)
    ph.generate_displacements(distance=distance)
    return ph


def _to_ase(supercell: PhonopyAtoms) -> ase.Atoms:
    """A displaced supercell as periodic ASE ``Atoms``."""
    import ase

    return ase.Atoms(numbers=supercell.numbers, positions=supercell.positions, cell=supercell.cell, pbc=True)


def _properties(ph: Phonopy, forces: np.ndarray, band_path: Any, band_points: int, mesh: Any,
                temperatures: Sequence[float] | None, plot: Path | None) -> Path | None:
    """Give ``ph`` its forces, make its force constants and what was asked; the plot's path."""
    from phonopy.phonon.band_structure import get_band_qpoints_and_path_connections

    ph.forces = forces
    ph.produce_force_constants(show_drift=False)
    if band_path == "auto":
        ph.auto_band_structure(npoints=band_points)
    elif band_path is not None:
        qpoints, connections = get_band_qpoints_and_path_connections(band_path, npoints=band_points)
        ph.run_band_structure(qpoints, path_connections=connections)
    if mesh is not None:
        ph.run_mesh(mesh)
        ph.run_total_dos()
        if temperatures is not None:
            ph.run_thermal_properties(temperatures=temperatures)
    if plot is None:
        return None
    import matplotlib.pyplot as pyplot

    drawn = ph.plot_band_structure_and_dos() if mesh is not None else ph.plot_band_structure()
    figure = drawn.gcf()  # phonopy draws into a new figure; close it so a campaign does not pile them up
    figure.savefig(plot)
    pyplot.close(figure)
    return plot


def _dtype_of(model: Any) -> torch.dtype:
    """The dtype of ``model``'s floating parameters or buffers, else float64 (as
    :class:`~alchemi_core.models.ase_calculator.AlchemiCalculator` chooses)."""
    import torch
    if isinstance(model, torch.nn.Module):
        for t in (*model.parameters(), *model.buffers()):
            if t.dtype.is_floating_point:
                return t.dtype
    return torch.float64


def _fail(failures: dict[int, str], index: int, reason: str, strict: bool) -> None:
    """Record why structure ``index`` failed (or raise under ``strict``)."""
    if strict:
        raise PhononFailure(f"phonons: structure {index}: {reason}")
    failures[index] = reason


def _phonopy() -> type[Phonopy]:
    """phonopy's ``Phonopy`` class, or a MissingDependencyError saying how to install it."""
    try:
        from phonopy import Phonopy
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "alchemi-properties' phonons need phonopy; install it with: pip install 'alchemi-properties[phonons]'"
        ) from None
    return Phonopy


def _require(module: str, option: str) -> None:
    """Raise MissingDependencyError naming ``option`` when ``module`` is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(f"phonons: {option} needs {module}; install it with: pip install {module}")

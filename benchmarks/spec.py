"""The fixed workloads of BENCHMARKS.md, as data every adapter reads.

Lennard-Jones argon: sigma 3.405 Å, epsilon 0.0104 eV, cutoff 2.5 sigma, FCC a = 5.26 Å, mass
39.948 amu, float32, periodic. Every framework gets the same numbers; where a peer takes them in
other units, the conversion is done here, once.

Example:
    >>> from benchmarks import spec
    >>> spec.CUTOFF
    8.5125
    >>> round(spec.FIRE.dt_fs, 2), round(spec.FIRE.dt_internal, 3)
    (6.43, 0.632)
"""

from __future__ import annotations

import math

import attrs

from alchemi_core.units import ACCELERATION, KB

SIGMA = 3.405
EPSILON = 0.0104
CUTOFF = 2.5 * SIGMA
LATTICE = 5.26
ARGON_MASS = 39.948
ARGON_Z = 18
#: Verlet skin (Å) for nvalchemi's neighbour list, and for alchemi's where the installed alchemi
#: has no skin by device (a comparison's base); alchemi's own: ``PotentialsTuning.skin``.
SKIN = 0.5

#: The time unit of eV, Å and amu, sqrt(amu Å² / eV), in fs (10.18 fs): nvalchemi's kernels and
#: TorchSim take times, rates and velocities in it.
INTERNAL_TIME_FS = 1.0 / math.sqrt(ACCELERATION)
#: Boltzmann constant in eV/K.
BOLTZMANN = KB


@attrs.frozen
class Langevin:
    """W1's thermostat: BAOAB Langevin."""

    temperature: float = 50.0  # K
    dt_fs: float = 5.0
    friction_per_fs: float = 0.01

    @property
    def kT(self) -> float:
        """Thermal energy in eV."""
        return BOLTZMANN * self.temperature


@attrs.frozen
class Fire:
    """FIRE as ASE runs it by default (``dt=0.1``, ``dtmax=1.0``, ``maxstep=0.2`` in ASE's units,
    where every atom has unit mass), the one parameter set all frameworks can express.

    alchemi's FIRE divides by the real masses and takes fs, so ASE's step for argon is
    ``dt_ASE * sqrt(m) * INTERNAL_TIME_FS`` (6.43 fs); nvalchemi's FIRE also divides by the
    masses and takes the internal time unit; TorchSim's ``ase_fire`` flavour is ASE's algorithm
    with unit masses and takes ``dt_ASE`` as is.
    """

    dt_ase: float = 0.1
    dt_max_ase: float = 1.0
    maxstep: float = 0.2  # Å
    fmax: float = 0.05  # eV/Å

    @property
    def dt_internal(self) -> float:
        return self.dt_ase * math.sqrt(ARGON_MASS)

    @property
    def dt_max_internal(self) -> float:
        return self.dt_max_ase * math.sqrt(ARGON_MASS)

    @property
    def dt_fs(self) -> float:
        return self.dt_internal * INTERNAL_TIME_FS

    @property
    def dt_max_fs(self) -> float:
        return self.dt_max_internal * INTERNAL_TIME_FS


LANGEVIN = Langevin()
FIRE = Fire()
#: Rattle of W2/W3 cells (Å): Gaussian noise of this standard deviation, seeded by the index.
RATTLE = 0.1

#: W1 shapes (atoms per system, systems), most important first (the order the harness runs).
W1_SHAPES = ((256, 1024), (108, 1), (108, 2048), (55296, 1))
#: W1's scaling shapes (issue #16): batches up to 16.8M atoms, and one system of 1M and of 4.1M
#: atoms (4 n^3 with n = 64 and 101).
W1_SCALING = ((256, 4096), (256, 16384), (256, 65536), (1_048_576, 1), (4_121_204, 1))
#: W6: NVT as W1 on a 2-core CPU.
W6_SHAPES = ((108, 64), (864, 1))
#: W2: 2048 cells of 108 atoms.
W2_CELLS, W2_REPEAT = 2048, 3
#: W3: cells n x n x n with n drawn from these (seed 0), FIRE then this many NVT steps.
W3_REPEATS = (2, 3, 4, 6)
W3_CELLS = 10_000
W3_MD_STEPS = 500
#: FIRE steps a W3 structure may take before it moves on to MD unconverged (then reported).
W3_RELAX_BUDGET = 1000
#: Atoms per batch for inflight batching (sampler budget), the same for every framework.
W3_MAX_ATOMS = 250_000
#: Processes that build W3's cells for alchemi's sampler (``SizeAwareSampler(workers=...)``), as a
#: user with a dataset made on request would ask for; where the installed alchemi predates
#: workers (``compare_commits`` against an older commit) the cells are built in the run's process.
W3_SAMPLER_WORKERS = 4
#: W5: W1 108x2048 with a snapshot of every system every this many steps.
W5_SHAPE, W5_EVERY = (108, 2048), 100


#: Neighbour-matrix columns over the expected count of neighbours (:func:`neighbor_columns`) for
#: W1, W2, W3 and W5. The most neighbours any atom of W1 256x1024 had at 50 K (``skin_sweep``'s
#: ``most_neighbors``, H100): 86 within 9.01 Å (a 0.5 Å skin), 100 within 9.51 Å (1.0 Å); 1.1
#: gives 96 and 112 columns, about 12 % more. An atom past them makes the run raise (the list's
#: ``verify``), never drop pairs. At 1.3 a 1.0 Å skin would take 136 columns and 740 bytes per
#: atom against 685 (W1 256x1024 on the H100), over the 700 of BENCHMARKS.md.
COLUMNS_HEADROOM = 1.1


def neighbor_columns(radius: float, headroom: float | None = None) -> int:
    """Neighbour-matrix columns for FCC argon within ``radius`` Å: the expected count in the
    sphere times ``headroom`` (None: COLUMNS_HEADROOM), rounded up to a multiple of 8 (fixed, so
    a step can be captured as a CUDA graph).

    Example:
        >>> neighbor_columns(CUTOFF + 1.0), neighbor_columns(CUTOFF + 0.5, headroom=1.3)
        (112, 112)
    """
    headroom = COLUMNS_HEADROOM if headroom is None else headroom  # read at the call: --variant
    density = 4.0 / LATTICE**3
    expected = density * 4.0 / 3.0 * math.pi * radius**3
    return int(math.ceil(expected * headroom / 8.0) * 8)

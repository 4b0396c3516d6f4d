"""The first-party plugins: the one list every other place derives from or is checked against.

``registry`` names the distribution to install when one of these is asked for and missing;
``scripts/dev`` runs this file (standard library only) for the distributions of an environment;
tests check that ``tox.ini``, the README's table, the ``plugins/`` folders and what each
installed plugin registers agree. To add a first-party plugin, add one entry here.

Example:
    >>> from alchemi_core.plugin.first_party import provides
    >>> "alchemi_core.dynamics.Langevin" in provides()["alchemi-integrators"]
    True
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class FirstParty:
    """One first-party plugin distribution.

    Attributes:
        distribution: The distribution name (``plugins/<distribution>`` holds it).
        provides: Registry names (``kind:name``) and public names (``alchemi_core.x.Name``) it
            registers.
        summary: What the README's table says it provides.
        env: The environment it installs into: ``"main"`` (scripts/dev, tox's plugin envs and
            ``all``) or the name of its own (dependencies that conflict with the main one).
        python: The Python (``"3.12"``) its own environment is made with, where its dependencies
            need a newer one than the main environment's ("": whichever ``python3`` is).
    """

    distribution: str
    provides: tuple[str, ...]
    summary: str
    env: str = "main"
    python: str = ""


def _exports(module: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{module}.{n}" for n in names)


PLUGINS: tuple[FirstParty, ...] = (
    FirstParty(
        "alchemi-integrators",
        (
            "integrator:velocity-verlet", "integrator:langevin", "integrator:nose-hoover", "integrator:csvr",
            "integrator:fire", "integrator:fire2", "integrator:lbfgs", "integrator:bfgs", "integrator:npt-mtk",
            "integrator:npt-crescale", "integrator:nph", "integrator:neb",
            *_exports(
                "alchemi_core.dynamics", "VelocityVerlet", "Langevin", "NoseHooverChain", "CSVR", "FIRE", "FIRE2",
                "LBFGS", "BFGS", "NPTMTK", "NPTCRescale", "NPH", "NEB",
            ),
        ),
        "`integrator:velocity-verlet`, `langevin` (BAOAB), `nose-hoover` (chains), `csvr`, `fire`, `fire2`, "
        "`lbfgs`, `bfgs`",
    ),
    FirstParty(
        "alchemi-potentials",
        ("model:lennard-jones", "model:morse", "model:ase", "model:d3", "model:sum"),
        "`model:lennard-jones`, `model:morse` (Warp kernels, batched cell lists), `model:ase` (any ASE calculator), "
        "`model:d3` (DFT-D3), `model:sum`",
    ),
    FirstParty(
        "alchemi-hooks",
        (
            "hook:max-force-clamp", "hook:logging", "hook:snapshot", "hook:converged-snapshot",
            "hook:nan-detector", "hook:energy-drift", "hook:freeze-atoms", "hook:wrap-periodic",
            "hook:progress", "hook:stage-timing",
            *_exports(
                "alchemi_core.dynamics.hooks", "MaxForceClampHook", "LoggingHook", "SnapshotHook",
                "ConvergedSnapshotHook", "NaNDetectorHook", "EnergyDriftMonitorHook", "FreezeAtomsHook",
                "WrapPeriodicHook", "ProgressHook", "StageTimingHook",
            ),
        ),
        "force clamp, logging, snapshots, NaN detection, energy drift, frozen atoms, periodic wrapping, "
        "progress, timing",
    ),
    FirstParty(
        "alchemi-zarr",
        (
            "sink:zarr", "alchemi_core.dynamics.ZarrData",
            *_exports("alchemi_core.data.datapipes", "AtomicDataZarrReader", "AtomicDataZarrWriter", "ShardedZarrStore",
                     "open_results_reader", "check_unique_results"),
        ),
        "`sink:zarr` (`ZarrData` on any fsspec URL), Zarr readers and writers for datasets",
    ),
    FirstParty(
        "alchemi-warp",
        ("sink:gpu-buffer", "buffer:warp", "alchemi_core.dynamics.GPUBuffer"),
        "`sink:gpu-buffer` (`GPUBuffer`), Warp kernels behind `Batch.put`/`defrag`",
    ),
    FirstParty(
        "alchemi-nccl",
        ("comm:nccl", "comm:gloo"),
        "`comm:nccl`, `comm:gloo`: `DistributedPipeline` over torch.distributed",
    ),
    FirstParty(
        "alchemi-electrostatics",
        ("model:ewald", "model:pme", "model:dsf"),
        "`model:ewald`, `model:pme`, `model:dsf`: Coulomb energies of per-atom charges (nvalchemi-toolkit-ops)",
    ),
    # Python calls over many structures (alchemi_properties.equation_of_state, ...): no component
    # to register.
    FirstParty(
        "alchemi-properties",
        (),
        "equations of state, elastic tensors, phonons (phonopy) and trajectory analysis of many structures at once",
    ),
    # aimnet's dependencies (nvalchemi-toolkit-ops, warp-lang) are the main environment's already.
    FirstParty(
        "alchemi-aimnet",
        ("model:aimnet2",),
        "`model:aimnet2` (AIMNet2: total charge in, partial charges out; molecules and periodic cells)",
    ),
    # The machine-learned potentials: mace-torch pins e3nn 0.4.4, sevenn needs e3nn >= 0.5, so
    # each installs into an environment of its own.
    FirstParty("alchemi-mace", ("model:mace",), "`model:mace` (any MACE model or `.model` file)", env="mace"),
    FirstParty("alchemi-sevennet", ("model:sevennet",), "`model:sevennet` (`7net-0` or a checkpoint)", env="sevennet"),
    # torch-sim-atomistic 0.6 needs Python >= 3.12.
    FirstParty("alchemi-torchsim", ("model:torchsim",), "`model:torchsim`: any TorchSim model (a torch-sim `ModelInterface`)",
               env="torchsim", python="3.12"),
    # orb-models 0.7 needs Python >= 3.12 and nvalchemi-toolkit-ops < 0.4.
    FirstParty("alchemi-orb", ("model:orb",), "`model:orb` (orb-v3 conservative and direct, by name or weights file)",
               env="orb", python="3.12"),
)


def by_name() -> dict[str, FirstParty]:
    """The entries by distribution name."""
    return {p.distribution: p for p in PLUGINS}


def provides() -> dict[str, tuple[str, ...]]:
    """``{distribution: what it provides}``, for the registry's install hints."""
    return {p.distribution: p.provides for p in PLUGINS}


def in_env(env: str = "main") -> list[str]:
    """Distributions that install into environment ``env``."""
    return [p.distribution for p in PLUGINS if p.env == env]


def other_envs() -> list[str]:
    """The environments besides ``main``, in list order."""
    return list(dict.fromkeys(p.env for p in PLUGINS if p.env != "main"))


def python_of(env: str) -> str:
    """The Python version environment ``env`` is made with ("": whichever ``python3`` is)."""
    versions = [p.python for p in PLUGINS if p.env == env and p.python]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".")), default="")


if __name__ == "__main__":
    # ``python3 alchemi_core/plugin/first_party.py ENV``: the distributions of ENV, one a line;
    # ``--envs``: the environments besides main; ``--python ENV``: the Python ENV is made with
    # (scripts/dev reads them before any environment exists).
    arg = sys.argv[1] if len(sys.argv) > 1 else "main"
    if arg == "--python":
        print(python_of(sys.argv[2]))
    else:
        print("\n".join(other_envs() if arg == "--envs" else in_env(arg)))

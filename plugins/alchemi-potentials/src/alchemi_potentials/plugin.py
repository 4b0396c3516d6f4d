"""Entry point of alchemi-potentials: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "lennard-jones",
        "alchemi_potentials.lennard_jones:LennardJones",
        summary="Lennard-Jones pair potential: Warp kernels, batched periodic cell lists, per-species tables",
        requires={"warp": "warp-lang"},
    )
    registrar.add(
        "morse",
        "alchemi_potentials.morse:Morse",
        summary="Morse pair potential: Warp kernels, batched periodic cell lists, per-species tables",
        requires={"warp": "warp-lang"},
    )
    registrar.add(
        "d3",
        "alchemi_potentials.d3:D3Dispersion",
        summary="DFT-D3 dispersion with Becke-Johnson damping (torch-dftd) on batched cell-list edges",
        requires={"torch_dftd": "--no-deps torch-dftd", "warp": "warp-lang"},
    )
    registrar.add(
        "sum",
        "alchemi_potentials.sum_model:SumModel",
        summary="the sum of several models (e.g. SevenNet + D3): energies, forces and stress added",
    )
    registrar.add(
        "ase",
        "alchemi_potentials.ase_model:AseCalculatorModel",
        summary="any ASE calculator, system by system on the CPU (validation, existing calculators)",
        requires={"ase": "alchemi-potentials[ase]"},
    )

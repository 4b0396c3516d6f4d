"""How often W1's systems would rebuild their neighbour lists under two criteria, counted on one
Langevin trajectory (alchemi alone, LJ argon at 50 K).

* ``half_skin`` (what the cell list does): a system rebuilds once one of its atoms has moved
  more than skin/2 since its last build.
* ``two_largest`` (exact): once its two largest displacements sum past the skin, the least that
  can bring a pair listed beyond ``cutoff + skin`` within the cutoff.

The trajectory does not depend on the criterion (a list is exact either way), so both are
counted on the same positions, step by step, each with its own build positions. The cells are
solids that stay in their cells, so displacements need no unwrapping.

    python -m benchmarks.rebuild_criteria --atoms 256 --systems 16 --steps 1500

Example:
    >>> import torch
    >>> x = torch.zeros(3, 1, 2, 3, dtype=torch.float64)
    >>> x[1, 0, 0, 0], x[2, 0, 0, 0], x[2, 0, 1, 0] = 0.3, 0.3, -0.15  # two atoms of one system
    >>> builds_per_system_step(x, 0.5)  # one atom past skin/2, but 0.3 + 0.15 < 0.5
    {'half_skin': 0.5, 'two_largest': 0.0}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks import spec


def builds_per_system_step(positions: torch.Tensor, skin: float) -> dict[str, float]:
    """Rebuilds per system and step of each criterion along ``positions`` ``[steps, systems,
    atoms, 3]`` (the first frame is every system's first build)."""
    steps, systems = positions.shape[0], positions.shape[1]
    out = {}
    for name in ("half_skin", "two_largest"):
        built = positions[0].clone()
        builds = 0
        for k in range(1, steps):
            moved = (positions[k] - built).norm(dim=-1)  # [systems, atoms]
            if name == "half_skin":
                due = moved.max(dim=1).values > skin / 2
            else:
                due = moved.topk(min(2, moved.shape[1]), dim=1).values.sum(dim=1) > skin
            builds += int(due.sum())
            built[due] = positions[k][due]
        out[name] = builds / (systems * (steps - 1))
    return out


def trajectory(atoms: int, systems: int, steps: int, skin: float, equilibrate: int) -> torch.Tensor:
    """Positions ``[steps, systems, atoms, 3]`` (float64) of W1's Langevin run on the CPU."""
    from alchemi_core.dynamics import DynamicsStage, Hook
    from alchemi_integrators import Langevin
    from alchemi_potentials import LennardJones
    from benchmarks.adapters.alchemi import to_batch
    from benchmarks.structures import replicated_crystal

    frames: list[torch.Tensor] = []

    class Record(Hook):
        stage = DynamicsStage.AFTER_STEP

        def __init__(self) -> None:
            super().__init__(frequency=1)

        def __call__(self, batch: Any, dynamics: Any) -> None:
            frames.append(batch.positions.detach().to(torch.float64).clone())

    p = spec.LANGEVIN
    batch = to_batch(replicated_crystal(atoms, systems, p.temperature, seed=0), "cpu")
    model = LennardJones(spec.EPSILON, spec.SIGMA, spec.CUTOFF, skin=skin)
    for seed, n, hooks in ((0, equilibrate, []), (1, steps, [Record()])):
        md = Langevin(model, dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs,
                      random_seed=seed, hooks=hooks)
        md.run(batch, n_steps=n)
    return torch.stack(frames).view(steps, systems, atoms, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rebuild_criteria", description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=256, help="atoms per system")
    parser.add_argument("--systems", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1500, help="steps counted")
    parser.add_argument("--equilibrate", type=int, default=300)
    parser.add_argument("--skin", type=float, default=0.5, help="Å")
    args = parser.parse_args(argv)
    positions = trajectory(args.atoms, args.systems, args.steps, args.skin, args.equilibrate)
    result = {"atoms": args.atoms, "systems": args.systems, "steps": args.steps, "skin": args.skin,
              "builds_per_system_step": builds_per_system_step(positions, args.skin)}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How often W1's systems would rebuild their neighbour lists under several criteria, counted on
one Langevin trajectory (alchemi alone, LJ argon at 50 K).

* ``half_skin`` (what the cell list does alone): a system rebuilds once one of its atoms has
  moved more than skin/2 since its last build.
* ``two_largest`` (exact): once its two largest displacements sum past the skin, the least that
  can bring a pair listed beyond ``cutoff + skin`` within the cutoff.
* ``joined_F`` (the cell list's ``join_fraction=F``): ``half_skin``, and in a step where some
  system rebuilds by it, every system with an atom past ``F * skin/2`` rebuilds too.

The trajectory does not depend on the criterion (a list is exact either way), so all are counted
on the same positions, step by step, each with its own build positions. Each reports builds per
system and step, the share of steps in which some system rebuilds (what a GPU pays a search
for) and how many systems rebuild in such a step. The cells are solids that stay in their
cells, so displacements need no unwrapping.

    python -m benchmarks.rebuild_criteria --atoms 256 --systems 256 --steps 600 --joins 0.9,0.8,0.7

Example:
    >>> import torch
    >>> counter = RebuildCounter(skin=0.5, joins=[0.8])
    >>> x = torch.zeros(2, 2, 3, dtype=torch.float64)  # two systems of two atoms
    >>> counter.add(x)  # the first frame: every system's first build
    >>> x[0, 0, 0], x[0, 1, 0], x[1, 0, 0] = 0.3, -0.15, 0.21  # system 1 is at 0.84 of skin/2
    >>> counter.add(x)
    >>> {name: c["builds_per_system_step"] for name, c in counter.summary().items()}
    {'half_skin': 0.5, 'two_largest': 0.0, 'joined_0.8': 1.0}
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks import spec


class RebuildCounter:
    """Counts each criterion's rebuilds along frames ``[systems, atoms, 3]`` given in order."""

    def __init__(self, skin: float, joins: Sequence[float] = ()) -> None:
        self.skin = skin
        self.names = ["half_skin", "two_largest", *(f"joined_{f:g}" for f in joins)]
        self.joins = {f"joined_{f:g}": f for f in joins}
        self.built: dict[str, torch.Tensor] = {}
        self.builds = dict.fromkeys(self.names, 0)
        self.steps_with_build = dict.fromkeys(self.names, 0)
        self.steps = 0
        self.systems = 0

    def add(self, frame: torch.Tensor) -> None:
        if not self.built:
            self.built = {name: frame.clone() for name in self.names}
            self.systems = frame.shape[0]
            return
        self.steps += 1
        for name in self.names:
            moved = (frame - self.built[name]).norm(dim=-1)  # [systems, atoms]
            largest = moved.max(dim=1).values
            if name == "two_largest":
                due = moved.topk(min(2, moved.shape[1]), dim=1).values.sum(dim=1) > self.skin
            else:
                due = largest > self.skin / 2
                if name in self.joins and bool(due.any()):
                    due = due | (largest > self.joins[name] * self.skin / 2)
            n = int(due.sum())
            self.builds[name] += n
            self.steps_with_build[name] += int(n > 0)
            self.built[name][due] = frame[due]

    def summary(self) -> dict[str, dict[str, float]]:
        """Per criterion: builds per system and step, the share of steps with a build, and the
        systems rebuilt in such a step."""
        steps = max(1, self.steps)
        return {
            name: {
                "builds_per_system_step": self.builds[name] / (max(1, self.systems) * steps),
                "share_of_steps_with_a_build": self.steps_with_build[name] / steps,
                "systems_per_build_step": self.builds[name] / max(1, self.steps_with_build[name]),
            }
            for name in self.names
        }


def count_on_trajectory(atoms: int, systems: int, steps: int, skin: float, equilibrate: int,
                        joins: Sequence[float]) -> RebuildCounter:
    """Run W1's Langevin dynamics on the CPU and count every criterion along it."""
    from alchemi_core.dynamics import DynamicsStage, Hook
    from alchemi_integrators import Langevin
    from alchemi_potentials import LennardJones
    from benchmarks.adapters.alchemi import to_batch
    from benchmarks.structures import replicated_crystal

    counter = RebuildCounter(skin, joins)

    class Count(Hook):
        stage = DynamicsStage.AFTER_STEP

        def __init__(self) -> None:
            super().__init__(frequency=1)

        def __call__(self, batch: Any, dynamics: Any) -> None:
            counter.add(batch.positions.detach().to(torch.float64).view(systems, atoms, 3))

    p = spec.LANGEVIN
    batch = to_batch(replicated_crystal(atoms, systems, p.temperature, seed=0), "cpu")
    model = LennardJones(spec.EPSILON, spec.SIGMA, spec.CUTOFF, skin=skin)
    for seed, n, hooks in ((0, equilibrate, []), (1, steps, [Count()])):
        md = Langevin(model, dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs,
                      random_seed=seed, hooks=hooks)
        md.run(batch, n_steps=n)
    return counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rebuild_criteria", description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=256, help="atoms per system")
    parser.add_argument("--systems", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1500, help="steps counted")
    parser.add_argument("--equilibrate", type=int, default=300)
    parser.add_argument("--skin", type=float, default=0.5, help="Å")
    parser.add_argument("--joins", default="", help="comma-separated join fractions to count too")
    args = parser.parse_args(argv)
    joins = [float(x) for x in args.joins.split(",") if x.strip()]
    counter = count_on_trajectory(args.atoms, args.systems, args.steps, args.skin, args.equilibrate, joins)
    summary = counter.summary()
    result = {"atoms": args.atoms, "systems": args.systems, "steps": args.steps, "skin": args.skin,
              "builds_per_system_step": {k: v["builds_per_system_step"] for k, v in summary.items()},
              "criteria": summary}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``ModelContract``: what every model (potential, MLIP, adapter) must satisfy.

Subclass it in a plugin's tests and implement :meth:`ModelContract.make_model`; override
:meth:`ModelContract.structures` to give systems the model is meant for (the default: small
rattled periodic argon-like cells, right for pair potentials), and the tolerances where the
model's precision asks for it. The inherited tests check:

* outputs: ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` in the positions' dtype and device,
  ``stress`` ``[B, 3, 3]`` when asked (models whose card says ``stress=True``);
* forces equal minus the gradient of the energy (central finite differences, float64);
* stress equals the strain derivative of the energy over the volume, ``(1/V) dE/de`` for a
  symmetric strain ``e`` applied to positions and cell (positive under tension, eV/Å³);
* translation invariance (energy and forces) and permutation invariance (energy; forces permute
  with the atoms);
* a system alone gives what it gives inside a batch of other systems;
* a direct call refuses what a run refuses, with the run's messages: an atomic number that is
  no element, a periodic cell of zero volume (periodic models), and stress asked of a system
  without a cell (models with stress).

Finite differences build a new batch per displaced configuration (kept alive for the test's
length, so no cache keyed on a batch's identity can mistake one for another) and copy every
output at once (models may return views of their own buffers or of the batch's fields).

Example::

    class TestLennardJones(ModelContract):
        def make_model(self):
            return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.models.base import model_card


def rattled_cells(
    sizes: Sequence[int] = (2, 1, 2),
    lattice: float = 5.26,
    rattle: float = 0.15,
    atomic_number: int = 18,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> list[AtomicData]:
    """Periodic FCC cells of ``n x n x n`` conventional cells (4 n³ atoms) for each ``n`` of
    ``sizes``, rattled by ``rattle`` Å (Gaussian, seeded) and sheared a little, so that no
    symmetry hides a wrong force or stress.

    Example:
        >>> [len(s.positions) for s in rattled_cells((1, 2))]
        [4, 32]
    """
    g = torch.Generator().manual_seed(seed)
    basis = torch.tensor([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]], dtype=torch.float64)
    out = []
    for n in sizes:
        grid = torch.stack(torch.meshgrid(*[torch.arange(n, dtype=torch.float64)] * 3, indexing="ij"), -1)
        frac = (grid.reshape(-1, 1, 3) + basis).reshape(-1, 3) / n
        cell = torch.eye(3, dtype=torch.float64) * (lattice * n)
        cell[1, 0] += 0.03 * lattice * n  # a slight shear: cells need not be orthorhombic
        pos = frac @ cell + rattle * torch.randn(len(frac), 3, generator=g, dtype=torch.float64)
        out.append(
            AtomicData(
                atomic_numbers=torch.full((len(frac),), atomic_number, dtype=torch.long),
                positions=pos.to(dtype),
                cell=cell.to(dtype),
                pbc=torch.tensor([True, True, True]),
            )
        )
    return out


def _evaluate(model: Any, batch: Batch, stress: bool = False) -> dict[str, torch.Tensor]:
    out: Mapping[str, torch.Tensor] = model(batch, compute_stress=True) if stress else model(batch)
    return {k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)}


class ModelContract:
    """Contract tests for a model (see the module docstring). Implement ``make_model()``."""

    device = "cpu"
    #: Dtypes the model takes (each output test runs for each).
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    #: Finite-difference step, Å (positions) and dimensionless (strain).
    fd_step = 1e-4
    #: Tolerance of forces against finite differences (eV/Å), relative to the largest force.
    force_rtol = 1e-4
    #: Tolerance of stress against finite differences (eV/Å³), absolute.
    stress_atol = 1e-6
    #: Tolerance of float64 comparisons between equal configurations (invariances, batching).
    same_atol = 1e-9
    #: Atoms per system whose forces are checked by finite differences (the first ones).
    fd_atoms = 3

    def make_model(self) -> Any:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        """The systems the tests evaluate (at least two, of different sizes)."""
        return rattled_cells(dtype=dtype)

    def batch(self, structures: Sequence[AtomicData]) -> Batch:
        return Batch.from_data_list(list(structures), device=self.device)

    def gives_stress(self, model: Any) -> bool:
        return bool(model_card(model).stress)

    # ------------------------------------------------------------------ outputs
    def test_outputs_have_the_documented_shapes_and_dtypes(self) -> None:
        model = self.make_model()
        for dtype in self.dtypes:
            batch = self.batch(self.structures(dtype))
            out = _evaluate(model, batch)
            assert out["energy"].shape == (batch.num_graphs, 1), f"energy of shape {tuple(out['energy'].shape)}"
            assert out["forces"].shape == (batch.num_nodes, 3), f"forces of shape {tuple(out['forces'].shape)}"
            for name in ("energy", "forces"):
                assert out[name].dtype == dtype, f"{name} is {out[name].dtype} for {dtype} positions"
                assert out[name].device == batch.device
                assert bool(torch.isfinite(out[name]).all()), f"{name} is not finite"
            if self.gives_stress(model):
                stress = _evaluate(model, batch, stress=True)["stress"]
                assert stress.shape == (batch.num_graphs, 3, 3) and stress.dtype == dtype
                torch.testing.assert_close(stress, stress.transpose(1, 2), atol=self.stress_atol, rtol=0.0)

    # ------------------------------------------------------------------ derivatives
    def test_forces_are_minus_the_energy_gradient(self) -> None:
        model = self.make_model()
        structures = self.structures(torch.float64)
        forces = _evaluate(model, self.batch(structures))["forces"].cpu()
        keep: list[Batch] = []
        h = self.fd_step
        offset = 0
        for k, s in enumerate(structures):
            for atom in range(min(self.fd_atoms, len(s.positions))):
                for axis in range(3):
                    energies = []
                    for sign in (1.0, -1.0):
                        moved = [_displaced(x, atom, axis, sign * h) if i == k else x for i, x in enumerate(structures)]
                        b = self.batch(moved)
                        keep.append(b)
                        energies.append(_evaluate(model, b)["energy"][k, 0].item())
                    numeric = -(energies[0] - energies[1]) / (2 * h)
                    got = float(forces[offset + atom, axis])
                    scale = max(1.0, float(forces.abs().max()))
                    assert abs(got - numeric) <= self.force_rtol * scale, (
                        f"system {k} atom {atom} axis {axis}: force {got:.6g} but -dE/dx = {numeric:.6g}"
                    )
            offset += len(s.positions)

    def test_stress_is_the_strain_derivative_of_the_energy(self) -> None:
        model = self.make_model()
        if not self.gives_stress(model):
            pytest.skip("the model gives no stress (its card says stress=False)")
        structures = self.structures(torch.float64)
        stress = _evaluate(model, self.batch(structures), stress=True)["stress"].cpu()
        keep: list[Batch] = []
        h = self.fd_step
        for a in range(3):
            for b in range(a, 3):
                energies = []
                for sign in (1.0, -1.0):
                    strain = torch.eye(3, dtype=torch.float64)
                    strain[a, b] += 0.5 * sign * h
                    strain[b, a] += 0.5 * sign * h
                    batch = self.batch([_strained(s, strain) for s in structures])
                    keep.append(batch)
                    energies.append(_evaluate(model, batch)["energy"][:, 0].cpu())
                for k, s in enumerate(structures):
                    volume = float(torch.linalg.det(s.cell.reshape(3, 3).to(torch.float64)).abs())
                    numeric = float(energies[0][k] - energies[1][k]) / (2 * h) / volume
                    got = float(stress[k, a, b])
                    assert abs(got - numeric) <= self.stress_atol, (
                        f"system {k} stress[{a},{b}] = {got:.6g} eV/Å³ but (1/V) dE/de = {numeric:.6g}"
                    )

    # ------------------------------------------------------------------ invariances
    def test_translation_changes_nothing(self) -> None:
        model = self.make_model()
        structures = self.structures(torch.float64)
        before = _evaluate(model, self.batch(structures))
        shift = torch.tensor([0.37, -1.21, 2.03], dtype=torch.float64)
        moved = [_with(s, positions=s.positions + shift.to(s.positions.dtype)) for s in structures]
        after = _evaluate(model, self.batch(moved))
        self._assert_same(before["energy"], after["energy"], "energy after a translation")
        self._assert_same(before["forces"], after["forces"], "forces after a translation")

    def test_permuting_atoms_permutes_forces_and_keeps_the_energy(self) -> None:
        model = self.make_model()
        structures = self.structures(torch.float64)
        g = torch.Generator().manual_seed(1)
        perms = [torch.randperm(len(s.positions), generator=g) for s in structures]
        before = _evaluate(model, self.batch(structures))
        after = _evaluate(model, self.batch([_permuted(s, p) for s, p in zip(structures, perms)]))
        self._assert_same(before["energy"], after["energy"], "energy after permuting atoms")
        offsets = torch.cumsum(torch.tensor([0] + [len(s.positions) for s in structures[:-1]]), 0)
        index = torch.cat([p + o for p, o in zip(perms, offsets)]).to(before["forces"].device)
        self._assert_same(before["forces"][index], after["forces"], "forces after permuting atoms")

    def test_a_system_alone_equals_the_same_system_in_a_batch(self) -> None:
        model = self.make_model()
        structures = self.structures(torch.float64)
        together = _evaluate(model, self.batch(structures))
        offset = 0
        for k, s in enumerate(structures):
            alone = _evaluate(self.make_model(), self.batch([s]))
            n = len(s.positions)
            self._assert_same(together["energy"][k : k + 1], alone["energy"], f"energy of system {k}")
            self._assert_same(together["forces"][offset : offset + n], alone["forces"], f"forces of system {k}")
            offset += n

    # ------------------------------------------------------------------ input checks
    def test_a_direct_call_refuses_an_unknown_element(self) -> None:
        from alchemi_core.errors import InvalidDataError

        first, *rest = self.structures(torch.float64)
        numbers = first.atomic_numbers.clone()
        numbers[0] = 119
        with pytest.raises(InvalidDataError, match=r"atomic numbers \[119\] are unknown elements"):
            self.make_model()(self.batch([*rest, _with(first, atomic_numbers=numbers)]))

    def test_a_direct_call_refuses_a_periodic_cell_of_zero_volume(self) -> None:
        from alchemi_core.errors import InvalidDataError

        model = self.make_model()
        if not model_card(model).periodic:
            pytest.skip("the model is not periodic (its card says periodic=False)")
        first, *rest = self.structures(torch.float64)
        cell = first.cell.reshape(3, 3).clone()
        cell[2] = cell[0] + cell[1]  # coplanar rows: no volume
        flat = _with(first, cell=cell.reshape(first.cell.shape), pbc=torch.ones_like(first.pbc, dtype=torch.bool))
        with pytest.raises(InvalidDataError, match="zero volume"):
            model(self.batch([*rest, flat]))

    def test_stress_of_a_system_without_a_cell_is_refused_naming_it(self) -> None:
        from alchemi_core.errors import InvalidDataError

        model = self.make_model()
        if not self.gives_stress(model):
            pytest.skip("the model gives no stress (its card says stress=False)")
        first, *rest = self.structures(torch.float64)
        molecule = AtomicData(atomic_numbers=first.atomic_numbers, positions=first.positions,
                              cell=torch.zeros_like(first.cell), pbc=torch.zeros_like(first.pbc, dtype=torch.bool))
        batch = self.batch([*rest, molecule])
        with pytest.raises(InvalidDataError, match=rf"stress was asked of systems \[{len(rest)}\]"):
            model(batch, compute_stress=True)
        assert torch.isfinite(_evaluate(model, batch)["energy"]).all()  # energy and forces are fine

    def _assert_same(self, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        scale = max(1.0, float(a.abs().max())) if a.numel() else 1.0
        torch.testing.assert_close(a, b, atol=self.same_atol * scale, rtol=0.0, msg=lambda m: f"{what}: {m}")


def _with(s: AtomicData, **fields: torch.Tensor) -> AtomicData:
    data: dict[str, Any] = {k: getattr(s, k) for k in s.keys()}
    data.update(fields)
    levels = {k: level.value for k, level in s.levels.items() if k not in ("atomic_numbers", "positions")}
    return AtomicData(levels=levels, **data)


def _displaced(s: AtomicData, atom: int, axis: int, step: float) -> AtomicData:
    pos = s.positions.clone()
    pos[atom, axis] += step
    return _with(s, positions=pos)


def _strained(s: AtomicData, strain: torch.Tensor) -> AtomicData:
    """Positions and cell (row vectors) deformed by ``x -> x (I + e)``."""
    dtype = s.positions.dtype
    m = strain.to(dtype)
    return _with(s, positions=s.positions @ m, cell=(s.cell.reshape(3, 3) @ m).reshape(s.cell.shape))


def _permuted(s: AtomicData, perm: torch.Tensor) -> AtomicData:
    """The same structure with its atoms (every atom-level field) in the order ``perm``."""
    if s.num_edges:
        raise ValueError("permuting a structure with edges would need its edges renumbered")
    return _with(s, **{k: getattr(s, k)[perm] for k, level in s.levels.items() if level.value == "node"})

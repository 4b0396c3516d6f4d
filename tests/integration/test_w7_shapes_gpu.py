"""W7's shapes on a GPU: 7net-0 and a MACE with random weights shaped like MACE-MP-0 small (as
``benchmarks.w7_mlip`` builds them) step Cu cells of 108 atoms, 1 to 256 of them, whole and in
chunks of 6,912 atoms, with finite results, no error and the chunked results equal to the whole
batch's: all sizes on the same models in one process, and each size in a fresh process.

Every size takes what the benchmark does: two runs, each on a fresh batch of the same
structures, then the network on fixed edges. (The second fresh batch of 256 cells in chunks once
read its edges through the first run's chunk plan: a device-side assert.) The whole batch runs
where the model's memory estimate fits the free device memory (7net-0 and MACE on e3nn's kernels
need about 200 and 94 GB at 256 cells; on cuEquivariance's, 41 and 33 GB).

SevenNet and MACE need different e3nn versions, so each environment runs its own model and skips
the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.w7_mlip import cu_cells, fixed_graph_seconds, free_memory, langevin, networks  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SIZES = (1, 16, 64, 256)
CHUNK_ATOMS = 6912
STEPS = 3
#: The package each model needs (the other environment lacks it).
NEEDS = {"sevennet": "sevenn", "mace": "mace"}
#: Of the free device memory, what a whole batch may plan on by the model's estimate.
MEMORY_SHARE = 0.8


def model_of(kind: str, chunk_atoms: int | None, device: str = "cuda") -> Any:
    return networks(kind, device, chunk_atoms=chunk_atoms, with_peers=False)[0]


def fits(model: Any, cells: int) -> bool:
    """Whether ``cells`` W7 cells fit at once by the model's bytes per atom (a chunked model holds
    one chunk's activations)."""
    if model.chunk_atoms is not None:
        return True
    free_memory()
    return model.bytes_per_atom() * 108 * cells <= MEMORY_SHARE * torch.cuda.mem_get_info()[0]


def step_like_w7(model: Any, cells: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    """Two captured runs of :data:`STEPS` Langevin steps, each on a fresh batch of ``cells`` W7
    cells, and the network on fixed edges, as the benchmark takes a size; each run's energies
    and forces finite and nothing quarantined. Returns one more fresh batch's energy and forces
    (on the CPU), verified."""
    from alchemi_core.data import Batch

    atoms = cu_cells(cells)
    for run in range(2):
        batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
        md = langevin(model, STEPS, compiled=True)
        with md:
            out = md.run(batch)
        where = f"{cells} cells, run {run + 1}, chunk_atoms={model.chunk_atoms}"
        assert bool(torch.isfinite(out.energy).all()) and bool(torch.isfinite(out.forces).all()), where
        if "status" in out:
            assert bool((out.status >= 0).all()), f"{where}: quarantined {out.status.reshape(-1).tolist()}"
    fixed_graph_seconds(model, atoms, device, repeats=1)
    batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
    result = {k: v.detach().cpu() for k, v in model(batch).items()}
    model.verify(batch)
    return result


def assert_same_results(chunked: dict[str, torch.Tensor], whole: dict[str, torch.Tensor], cells: int) -> None:
    assert bool(torch.isfinite(chunked["energy"]).all()) and bool(torch.isfinite(chunked["forces"]).all())
    torch.testing.assert_close(chunked["energy"], whole["energy"], rtol=1e-5, atol=1e-3, msg=f"{cells} cells")
    # float32 sums in another order: MACE's chunked forces were within 2e-5 eV/Å of the whole batch's
    scale = float(whole["forces"].abs().max())
    torch.testing.assert_close(chunked["forces"], whole["forces"], rtol=0, atol=max(2e-5, 1e-3 * scale),
                               msg=f"{cells} cells")


@pytest.fixture(params=sorted(NEEDS))
def kind(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(NEEDS[request.param])
    return str(request.param)


@pytest.mark.timeout(1800)
def test_w7_shapes_whole_and_in_chunks_in_one_process(kind: str) -> None:
    chunked, whole = model_of(kind, CHUNK_ATOMS), model_of(kind, None)
    left_out = []
    for cells in SIZES:
        in_chunks = step_like_w7(chunked, cells)
        if fits(whole, cells):
            assert_same_results(in_chunks, step_like_w7(whole, cells), cells)
        else:
            left_out.append(cells)
        free_memory()
    print(f"{kind}: whole batches left out (more than the free memory by the model's estimate): {left_out}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chunk_atoms", [CHUNK_ATOMS, None], ids=["chunked", "whole"])
@pytest.mark.parametrize("cells", SIZES)
def test_w7_shapes_in_a_fresh_process(kind: str, cells: int, chunk_atoms: int | None) -> None:
    cmd = [sys.executable, __file__, kind, str(cells), str(chunk_atoms)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads(lines[-1])
    if report.get("left_out"):
        pytest.skip(report["left_out"])
    assert report["finite"] and report["num_systems"] == cells, report


def _fresh_process(kind: str, cells: int, chunk_atoms: int | None) -> None:
    """One size in this process (what :func:`test_w7_shapes_in_a_fresh_process` starts)."""
    model = model_of(kind, chunk_atoms)
    if not fits(model, cells):
        print(json.dumps({"left_out": f"{cells} whole cells need {model.bytes_per_atom() * 108 * cells / 1e9:.0f} GB "
                                      "by the model's estimate, more than the GPU has free"}))
        return
    out = step_like_w7(model, cells)
    finite = bool(torch.isfinite(out["energy"]).all()) and bool(torch.isfinite(out["forces"]).all())
    print(json.dumps({"finite": finite, "num_systems": int(out["energy"].shape[0])}))


if __name__ == "__main__":
    _fresh_process(sys.argv[1], int(sys.argv[2]), None if sys.argv[3] == "None" else int(sys.argv[3]))

"""Quiet by default: a model forward prints nothing (no Warp banner, no CUDA-driver notice on a
CPU machine, no line per kernel module); ALCHEMI_VERBOSE=1 shows Warp's messages again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("warp")
pytest.importorskip("alchemi_potentials")

FORWARD = """
import torch
from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
device = sys.argv[1]
g = torch.Generator().manual_seed(0)
data = AtomicData(atomic_numbers=torch.full((32,), 18), positions=torch.rand(32, 3, generator=g) * 10,
                  cell=torch.eye(3) * 10.0, pbc=torch.tensor([True, True, True]))
model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=4.0)
out = model(Batch.from_data_list([data, data]).to(device))
assert torch.isfinite(out["energy"]).all()
"""


def _run(device: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "ALCHEMI_VERBOSE"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", "import sys\n" + FORWARD, device], capture_output=True, text=True,
                          env=e, timeout=600)


def test_a_model_forward_prints_nothing_by_default():
    result = _run("cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == "", (result.stdout, result.stderr)


def test_alchemi_verbose_shows_warps_messages():
    result = _run("cpu", ALCHEMI_VERBOSE="1")
    assert result.returncode == 0, result.stderr
    assert "Warp" in result.stdout + result.stderr


@pytest.mark.gpu
def test_a_model_forward_on_the_gpu_prints_nothing():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = _run("cuda")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == "", (result.stdout, result.stderr)

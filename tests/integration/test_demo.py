"""`alchemi demo`, the README's main job: relax then NVT MD in one fused inflight stage, streamed
to a store, summarised and plotted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from alchemi_core.cli import main


def test_demo_accounts_for_every_structure_thermalises_and_leaves_a_store_and_plots(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib import image

    from alchemi_zarr import AtomicDataZarrReader

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["demo", "--structures", "24", "--md-steps", "150", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["structures_in"] == summary["structures_out"] == 24
    assert summary["every_structure_once"] is True
    # FIRE-relaxed FCC argon sits near the LJ cohesive energy (about -0.08 eV/atom with this cutoff).
    assert -0.085 < summary["mean_energy_per_atom_eV"] < -0.07
    # 150 Langevin steps at 50 K starting from 50 K: a sample mean over 24 small cells.
    assert 35.0 < summary["mean_temperature_K"] < 65.0
    reader = AtomicDataZarrReader(tmp_path / "demo-results.zarr")
    assert sorted(reader.read_batch().system_id.tolist()) == list(range(24))
    assert sorted(p.split("/")[-1] for p in summary["plots"]) == ["energy.png", "fmax.png", "temperature.png",
                                                                   "throughput.png"]
    for p in summary["plots"]:
        assert (tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = image.imread(tmp_path / p)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 400 and pixels.std() > 0.05  # a drawn picture
    # Running it again replaces the store instead of appending to it.
    again = CliRunner().invoke(main, ["demo", "--structures", "5", "--md-steps", "10", "--plots", "", "--json"])
    assert again.exit_code == 0, again.output
    assert len(AtomicDataZarrReader(tmp_path / "demo-results.zarr")) == 5


def test_the_human_summary_has_the_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["demo", "--structures", "6", "--md-steps", "10", "--plots", "", "--device",
                                       "cpu"])
    assert result.exit_code == 0, result.output
    assert "structures in / out    6 / 6 (each exactly once)" in result.stdout
    assert "energy/atom (eV)" in result.stdout and "final T (K)" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--structures", "0"], "--structures"),
        (["--fmax", "-1"], "--fmax"),
        (["--md-steps", "-3"], "--md-steps"),
        (["--device", "cuda:7" if __import__("torch").cuda.is_available() else "cuda"], "device"),
        (["--device", "tpu"], "device"),
    ],
)
def test_bad_options_are_one_line_errors_with_status_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["demo", *args])
    assert result.exit_code == 2, result.output
    assert says in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "demo-results.zarr").exists()


@pytest.mark.gpu
def test_the_demo_runs_on_the_gpu_quietly_and_leaves_a_store_and_plots(tmp_path):
    import os
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {k: v for k, v in os.environ.items() if k != "ALCHEMI_VERBOSE"}
    result = subprocess.run([sys.executable, "-m", "alchemi_core.cli", "demo", "--json"], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["device"].startswith("cuda") and summary["every_structure_once"]
    assert summary["structures_out"] == 300 and -0.085 < summary["mean_energy_per_atom_eV"] < -0.07
    assert "Warp" not in result.stderr and "Module" not in result.stderr, result.stderr
    for p in summary["plots"]:
        assert (tmp_path / p).read_bytes()[:4] == b"\x89PNG"
    print(f"demo on {summary['device']}: {summary['wall_s']:.2f} s, {summary['structures_per_hour']:.3g} structures/h")

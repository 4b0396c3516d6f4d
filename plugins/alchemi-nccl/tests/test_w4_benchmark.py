"""The W4 benchmark script runs (smoke size) in both modes and its accounting holds, so the
script the lead runs on two GPUs is known to work."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "w4_pipeline.py"


def test_fused_baseline_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("w4_pipeline", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "w3.json"
    module.main(["--fused", "--smoke", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["workload"] == "W3" and result["structures_out"] == result["structures_in"] == 12
    assert "structures/h" in capsys.readouterr().out


@pytest.mark.multiprocess
def test_two_rank_pipeline_smoke(tmp_path: Path) -> None:
    from alchemi_nccl.spawn import launch_script

    out = tmp_path / "w4.json"
    outcomes = launch_script(str(SCRIPT), 2, ["--smoke", "--backend", "comm:gloo", "--json", str(out)], timeout_s=180)
    for o in outcomes:
        assert o.returncode == 0, o.output[-3000:]
    result = json.loads(out.read_text())
    assert result["workload"] == "W4" and result["structures_out"] == result["structures_in"] == 12
    assert result["backend"] == "comm:gloo"

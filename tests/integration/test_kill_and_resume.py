"""SIGKILL at random steps, then resume: every structure is stored exactly once and the final
state equals an uninterrupted run's (issue 13, finding 1: a resumed run with a ZarrData sink used
to store records twice, 6 runs in 20)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("kill_resume_driver.py")
TRIALS = 20


@pytest.mark.parametrize("sink", ["host", "zarr"])
def test_random_kills_lose_and_repeat_nothing(tmp_path, sink):
    if sink == "zarr":
        pytest.importorskip("alchemi_zarr")
    done = subprocess.run(
        [sys.executable, str(DRIVER), sink, str(TRIALS), "2026", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    expected = report["expected_ids"]
    assert expected == list(range(14))
    trials = report["trials"]
    assert len(trials) == TRIALS
    assert sum(len(t["kills"]) for t in trials) >= TRIALS  # every trial was killed at least once
    for t in trials:
        assert t["system_ids"] == expected, f"trial {t['trial']} (killed at steps {t['kills']}): {t['system_ids']}"
        assert t["same"], f"trial {t['trial']} (killed at steps {t['kills']}) ended in another state"


def test_a_static_run_killed_and_resumed_stores_each_structure_once(tmp_path):
    """``integrator:static`` into a Zarr store: every structure once, each with the energy of the
    uninterrupted run."""
    pytest.importorskip("alchemi_zarr")
    done = subprocess.run(
        [sys.executable, str(DRIVER), "zarr", "8", "2027", str(tmp_path), "static"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["expected_ids"] == list(range(14))
    assert sum(len(t["kills"]) for t in report["trials"]) >= 8
    for t in report["trials"]:
        assert t["system_ids"] == report["expected_ids"], f"trial {t['trial']} (killed at steps {t['kills']})"
        assert t["same"], f"trial {t['trial']} (killed at steps {t['kills']}) ended in another state"

"""A pipeline rank SIGKILLed mid-run: the survivors save what they hold and name what was lost.

One process per rank over gloo (``pipeline_scenarios.py salvage``). Every stage has a HostMemory
sink; each survivor prints its ``RankLostError``'s fields and its sink's ``(system_id, status)``
pairs. Every structure that entered is then either in a survivor's sink or named lost (sent to
the dead rank and not received back downstream of it), exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alchemi_nccl.spawn import RankOutcome, launch_script

pytestmark = pytest.mark.multiprocess

SCENARIOS = str(Path(__file__).with_name("pipeline_scenarios.py"))
N_STRUCTURES = 9  # pipeline_scenarios.SIZES


def salvage_report(outcome: RankOutcome) -> dict[str, Any]:
    lines = [ln for ln in outcome.output.splitlines() if ln.startswith("SALVAGE ")]
    assert outcome.returncode == 3 and lines, f"rank {outcome.rank} ({outcome.returncode}):\n{outcome.output[-3000:]}"
    return json.loads(lines[-1][len("SALVAGE "):])


@pytest.mark.parametrize(
    ("steps", "kill_rank", "kill_step"),
    [("40,40", 1, 2), ("40,3,40", 1, 5)],
    ids=["last-of-2", "middle-of-3"],
)
def test_survivors_save_what_they_hold_and_name_what_was_lost(steps: str, kill_rank: int, kill_step: int) -> None:
    n_ranks = len(steps.split(","))
    outcomes = launch_script(
        SCENARIOS, n_ranks, ["salvage", "--steps", steps, "--kill-rank", str(kill_rank), "--kill-step", str(kill_step)],
        timeout_s=120,
    )
    assert outcomes[kill_rank].returncode == -9, outcomes[kill_rank].output[-3000:]
    reports = {o.rank: salvage_report(o) for o in outcomes if o.rank != kill_rank}
    for r, rep in reports.items():
        assert rep["peer"] == kill_rank, rep["message"]
        assert f"rank {kill_rank}" in rep["message"]
        stored = [sid for sid, _ in rep["sink"]]
        assert len(stored) == len(set(stored)), f"rank {r} stored a structure twice: {stored}"
        saved = set(rep["saved"])
        assert len(saved) == len(rep["saved"])
        for sid in saved:
            assert str(sid) in rep["message"]
        if r < n_ranks - 1:  # a non-last rank's sink holds only what it saved
            assert set(stored) == saved, (r, rep)
        else:  # the last rank's: its finished results (status 1) and the unfinished it saved (0)
            assert saved == {sid for sid, status in rep["sink"] if status == 0}, rep
            assert set(stored) - saved == {sid for sid, status in rep["sink"] if status == 1}, rep
    upstream = reports[kill_rank - 1]
    assert upstream["lost"], "the dead rank had been sent structures, so some went with it"
    assert "went with it" in upstream["message"]
    downstream = reports.get(kill_rank + 1)
    passed_on = set(downstream["received_from_peer"]) if downstream else set()
    assert passed_on <= set(upstream["lost"])
    lost = [sid for sid in upstream["lost"] if sid not in passed_on]
    stored = [sid for rep in reports.values() for sid, _ in rep["sink"]]
    accounted = stored + lost
    assert sorted(accounted) == list(range(N_STRUCTURES)), (stored, lost)
    assert lost, "the kill came while the dead rank held structures"
    if downstream:
        assert passed_on, "the middle rank had passed some structures on before it died"
        assert downstream["saved"], "the last rank held unfinished structures"

"""Pipelines as users launch them: one process per rank over gloo, started the way torchrun starts
them (and by torchrun itself). A stage that raises makes every rank exit with an error at once;
a stage that hangs makes the others give up after ``timeout_s``.

Each rank of ``pipeline_scenarios.py`` prints ``FAIL_AT <time>`` when the injected failure
happens and ``EXIT_OK``/``EXIT_ERROR <time> <error>`` when it leaves, so the tests measure the
delay from the failure to every rank's exit, not the (machine-dependent) start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alchemi_nccl.spawn import RankOutcome, launch_script

pytestmark = pytest.mark.multiprocess

SCENARIOS = str(Path(__file__).with_name("pipeline_scenarios.py"))
#: A raised error reaches every rank through closed sockets and error frames: well under this.
RAISE_BOUND_S = 10.0
#: A killed rank reports nothing: its heartbeat goes stale after 10 s.
KILL_BOUND_S = 25.0


def stamp(outcome: RankOutcome, tag: str) -> float:
    lines = [ln for ln in outcome.output.splitlines() if ln.startswith(tag)]
    assert lines, f"rank {outcome.rank} printed no {tag}:\n{outcome.output[-3000:]}"
    return float(lines[-1].split()[1])


def stopped_by_peer(line: str) -> bool:
    """The exit line names a ``PeerError`` (``RankLostError`` is the one that says what was saved)."""
    return "PeerError" in line or "RankLostError" in line


def exit_line(outcome: RankOutcome) -> str:
    return next(ln for ln in outcome.output.splitlines() if ln.startswith("EXIT_"))


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_stage_that_raises_stops_every_rank_at_once(fail_rank: int) -> None:
    """Rank 0 hosts the rendezvous store (it dies with it); rank 1 has neighbours both ways."""
    timeout_s = 60.0
    outcomes = launch_script(SCENARIOS, 3, ["fail", "--fail-rank", str(fail_rank), "--timeout", str(timeout_s)], timeout_s=180)
    failed_at = stamp(outcomes[fail_rank], "FAIL_AT")
    for o in outcomes:
        assert o.returncode == 3, f"rank {o.rank} exited with {o.returncode}:\n{o.output[-3000:]}"
        assert "injected failure in the stage" in exit_line(o), exit_line(o)  # the origin's message
        assert stamp(o, "EXIT_ERROR") - failed_at < RAISE_BOUND_S  # not the 60 s timeout
    for o in outcomes:
        if o.rank != fail_rank:
            assert stopped_by_peer(exit_line(o)) and f"rank {fail_rank}" in exit_line(o)


def test_a_killed_rank_is_noticed_well_before_the_timeout() -> None:
    """Rank 1 is SIGKILLed mid-run: no error report, no error frame. Rank 2 sees its connection
    close at once; rank 0, done and only waiting for the others, sees its heartbeat stop
    (stale after 10 s) or rank 2's report. All well before the 60 s timeout."""
    outcomes = launch_script(SCENARIOS, 3, ["kill", "--fail-rank", "1", "--timeout", "60"], timeout_s=180)
    killed_at = stamp(outcomes[1], "FAIL_AT")
    assert outcomes[1].returncode == -9
    for r in (0, 2):
        o = outcomes[r]
        assert o.returncode == 3, o.output[-3000:]
        assert stopped_by_peer(exit_line(o)) and "rank 1" in exit_line(o), exit_line(o)
        assert stamp(o, "EXIT_ERROR") - killed_at < KILL_BOUND_S


def test_a_hung_stage_makes_the_others_stop_after_the_timeout() -> None:
    """Rank 1 stops answering (it sleeps 2 x timeout_s in a hook): rank 0 (sending to it, then
    waiting for it to finish) and rank 2 (receiving from it) stop with an error about
    timeout_s later; rank 1 itself fails when it wakes to broken links."""
    timeout_s = 8.0
    outcomes = launch_script(SCENARIOS, 3, ["hang", "--fail-rank", "1", "--timeout", str(timeout_s)], timeout_s=180)
    hung_at = stamp(outcomes[1], "FAIL_AT")
    for o in outcomes:
        assert o.returncode == 3, f"rank {o.rank} exited with {o.returncode}:\n{o.output[-3000:]}"
    for r in (0, 2):
        waited = stamp(outcomes[r], "EXIT_ERROR") - hung_at
        assert timeout_s - 1.0 < waited < timeout_s + 10.0, (r, waited, exit_line(outcomes[r]))
        assert stopped_by_peer(exit_line(outcomes[r]))


def test_torchrun_runs_a_two_stage_pipeline() -> None:
    """The documented launch: torchrun starts the ranks (its agent hosts the store) and
    comm:gloo joins from the environment it sets."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", SCENARIOS, "run", "--stages", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SINK_IDS [0, 1, 2, 3, 4, 5, 6, 7, 8]" in proc.stdout
    assert proc.stdout.count("EXIT_OK") == 2

"""Status codes must lead somewhere: every system that enters a run has to be stepped by a
stage or graduate, or the run would loop forever or end having written nothing.

Checked when an engine is built: the entry status is a stage's code, every convergence hook
moves systems from a stage's code to another stage's code or to graduation
(``>= exit_status``), and the exit status is no stage's code.

Example:
    >>> from alchemi_core.dynamics.status_flow import check_status_flow
    >>> check_status_flow([0, 1], entry=0, exit_status=2, moves=[(0, 0, 1, "opt")])
    >>> try:
    ...     check_status_flow([0], entry=0, exit_status=1, moves=[(0, 0, -7, "opt")])
    ... except ValueError as exc:
    ...     print(str(exc).split(", so")[0])
    opt: ConvergenceHook target_status=-7 is neither a stage's status code ([0]) nor graduation (>= exit_status 1)
"""

from __future__ import annotations

from collections.abc import Sequence

from alchemi_core.errors import ConfigurationError


def check_status_flow(
    codes: Sequence[int], entry: int, exit_status: int, moves: Sequence[tuple[int, int, int, str]]
) -> None:
    """Raise when a status code cannot be reached or leads nowhere (see the module docstring).

    Args:
        codes: The stages' status codes.
        entry: Status of systems entering the run.
        exit_status: Status at which systems have graduated.
        moves: ``(stage_code, source_status, target_status, stage_name)`` of each convergence hook.

    Raises:
        ConfigurationError: Naming the parameter, its value and what to pass instead.
    """
    known = sorted(int(c) for c in codes)
    if known[0] < 0:
        raise ConfigurationError(
            f"status code {known[0]} is negative; negative statuses mark quarantined structures, so stage "
            f"codes must be >= 0 (got {known})"
        )
    if exit_status in known:
        # The default, -1, stands for the number of stages: with codes that skip one it is a code.
        default = f" (the default, -1, stands for the number of stages, {len(known)})" \
            if exit_status == len(known) else ""
        raise ConfigurationError(
            f"exit_status={exit_status} is also a stage's status code ({known}){default}; pass "
            f"exit_status={max(known) + 1} (after the last stage)"
        )
    if entry not in known:
        then = "graduate without a single step" if entry >= exit_status else "never be stepped or written"
        raise ConfigurationError(
            f"entry_status={entry} is not a stage's status code ({known}): systems entering would {then}; "
            f"pass entry_status={known[0]} (the first stage) or another of {known}"
        )
    for code, source, target, name in moves:
        if source not in known:
            raise ConfigurationError(
                f"{name}: ConvergenceHook source_status={source} is not a stage's status code ({known}), so it "
                f"would never see a system; pass source_status=None (its own stage, {code}) or one of {known}"
            )
        if target == source:
            raise ConfigurationError(
                f"{name}: ConvergenceHook target_status={target} equals its source_status, so converged systems "
                "would never move on; pass target_status=None (the next stage)"
            )
        if target not in known and target < exit_status:
            raise ConfigurationError(
                f"{name}: ConvergenceHook target_status={target} is neither a stage's status code ({known}) nor "
                f"graduation (>= exit_status {exit_status}), so the systems it moves would never be stepped or "
                f"written; pass target_status=None (the next stage), one of {known} or {exit_status}"
            )

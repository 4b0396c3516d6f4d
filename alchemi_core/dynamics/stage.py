"""The nine points in a dynamics step where hooks run.

Within one step they come in this order: ``BEFORE_STEP``, ``BEFORE_PRE_UPDATE``,
``AFTER_PRE_UPDATE`` (the integrator's first half, e.g. half-kick and drift), ``BEFORE_COMPUTE``,
``AFTER_COMPUTE`` (the model forward), ``BEFORE_POST_UPDATE``, ``AFTER_POST_UPDATE`` (the
integrator's second half), ``AFTER_STEP``, and ``ON_CONVERGE`` (after a convergence check, with
``dynamics.converged_mask`` set).

Example:
    >>> from alchemi_core.dynamics import DynamicsStage
    >>> DynamicsStage.AFTER_COMPUTE < DynamicsStage.AFTER_STEP
    True
"""

from __future__ import annotations

import enum


class DynamicsStage(enum.IntEnum):
    """A hook point; the integer order is the order within a step."""

    BEFORE_STEP = 0
    BEFORE_PRE_UPDATE = 1
    AFTER_PRE_UPDATE = 2
    BEFORE_COMPUTE = 3
    AFTER_COMPUTE = 4
    BEFORE_POST_UPDATE = 5
    AFTER_POST_UPDATE = 6
    AFTER_STEP = 7
    ON_CONVERGE = 8


#: Points inside the integrator/model part of a step (a captured CUDA graph cannot hold them).
INNER_POINTS = frozenset(p for p in DynamicsStage if DynamicsStage.BEFORE_STEP < p < DynamicsStage.AFTER_STEP)

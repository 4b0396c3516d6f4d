"""What ``with stage:`` and ``stage.compile()`` do, for ``BaseDynamics`` and ``FusedStage``.

Inside ``with stage:`` a run happens on a CUDA stream of its own (when the batch is on a GPU),
so the GPU work can overlap with the host's; outside it, a run uses the current stream. That
stream is the thread's for the GPU (:func:`thread_stream`), the same for every stage and run:
torch's allocator caches freed blocks per stream, so with a new stream per stage a loop of runs
would leave each run's memory cached for a stream no one uses again.
``compile()`` asks the engine to capture the step as a CUDA graph and replay it: on a GPU the
per-step launch cost drops to one graph launch; on a CPU the step runs eagerly.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5).compile(mode="reduce-overhead")
    >>> md.compile_step
    True
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_streams = threading.local()


def thread_stream(purpose: str, index: int) -> torch.cuda.Stream:
    """This thread's stream for ``purpose`` on GPU ``index``, made at first use and the same for
    every stage and run after (see the module docstring; ``"capture"``: the engine's captures,
    ``"run"``: ``with stage:``)."""
    held: dict[tuple[str, int], torch.cuda.Stream] | None = getattr(_streams, "held", None)
    if held is None:
        held = _streams.held = {}
    stream = held.get((purpose, index))
    if stream is None:
        stream = held[purpose, index] = torch.cuda.Stream(device=index)
    return stream


def compile_stage(stage: Any, kwargs: dict[str, Any]) -> Any:
    """``stage.compile(**kwargs)``: capture the step as a CUDA graph when running on a GPU.

    The capture happens lazily, on the first steps of a run; steps where a hook fires inside
    the step, and the checks, run eagerly; the graph is captured again after the set of
    systems changes. Options such as ``mode`` and ``fullgraph`` are accepted for the seed's
    ``torch.compile``-style call and kept in ``compile_kwargs``.
    """
    stage.compile_step = True
    stage.compile_kwargs = dict(kwargs)
    return stage


def enter(stage: Any) -> Any:
    """``with stage:``: the stage's runs use this thread's run stream (on a GPU)."""
    if torch.cuda.is_available():
        stage._stream = thread_stream("run", torch.cuda.current_device())
    return stage


def leave(stage: Any) -> None:
    """The end of ``with stage:``: wait for the stage's GPU work; runs use the current stream again."""
    if stage._stream is not None:
        stage._stream.synchronize()
    stage._stream = None

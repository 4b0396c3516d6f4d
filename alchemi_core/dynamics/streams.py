"""What ``with stage:`` and ``stage.compile()`` mean, shared by ``BaseDynamics`` and ``FusedStage``.

Inside ``with stage:`` a run happens on a CUDA stream of its own (when the batch is on a GPU),
so the GPU work can overlap with the host's; outside it, a run uses the current stream. That
stream is the thread's for the GPU (:func:`thread_stream`), the same for every stage and run:
torch's allocator caches freed blocks per stream, so with a new stream per stage a loop of runs
would leave each run's memory cached for a stream no one uses again (W2 run again and again:
9 device allocations and about 150 MB more reserved memory per run on an H100).
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


class StreamedRun:
    """The context manager and ``compile()`` of a runnable stage."""

    compile_step: bool = False
    compile_kwargs: dict[str, Any]
    _stream: Any = None
    _in_context: bool = False

    def compile(self, **kwargs: Any) -> Any:
        """Capture the step as a CUDA graph when running on a GPU.

        The capture happens lazily, on the first steps of a run; steps where a hook fires inside
        the step, and the checks, run eagerly; the graph is captured again after the set of
        systems changes. Options such as ``mode`` and ``fullgraph`` are accepted for the seed's
        ``torch.compile``-style call and kept in ``compile_kwargs``.
        """
        self.compile_step = True
        self.compile_kwargs = dict(kwargs)
        return self

    def __enter__(self) -> Any:
        self._in_context = True
        if torch.cuda.is_available():
            self._stream = thread_stream("run", torch.cuda.current_device())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._stream = None
        self._in_context = False

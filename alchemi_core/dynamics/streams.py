"""What ``with stage:`` and ``stage.compile()`` mean, shared by ``BaseDynamics`` and ``FusedStage``.

Inside ``with stage:`` a run happens on a CUDA stream of its own (when the batch is on a GPU),
so the GPU work can overlap with the host's; outside it, a run uses the current stream.
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

from typing import Any

import torch


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
            self._stream = torch.cuda.Stream()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._stream = None
        self._in_context = False

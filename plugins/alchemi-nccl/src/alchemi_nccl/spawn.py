"""Start a group of ranks on this machine without torchrun: for tests and quick experiments.

:class:`RankPool` keeps worker processes up and runs a function on every rank of a fresh group
(each with a backend joined), so a test suite pays the start-up once; :func:`spawn_group` is a
one-off pool; :func:`launch_script` starts ``python script.py`` once per rank as torchrun would.

Example::

    from alchemi_nccl.spawn import spawn_group
    from alchemi_core.testing.contracts import rank_and_world_size
    spawn_group(2, rank_and_world_size)        # [(0, 2), (1, 2)]
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from alchemi_core.errors import PipelineError


def free_port() -> int:
    """A TCP port that was free a moment ago on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environ(rank: int, world_size: int, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables torchrun sets for ``rank`` on a single node."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    return env


def _load(target: Callable[..., Any] | tuple[str, str]) -> Callable[..., Any]:
    """A callable, or ``(path to a .py file, function name)`` loaded from that file."""
    if callable(target):
        return target
    path, name = target
    module_name = "_alchemi_job_" + os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return getattr(module, name)


def _serve(slot: int, jobs: Any, out: Any) -> None:
    """A pool worker: run jobs until told to stop (None)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        world_size, port, spec, timeout_s, target, kwargs = job
        os.environ.update(rank_environ(slot, world_size, port, base={}))
        try:
            from alchemi_core import registry

            fn = _load(target)
            backend = registry.build(spec, timeout_s=timeout_s)
            backend.init()
            try:
                result = fn(backend, **kwargs)
            finally:
                backend.shutdown()
            out.put((slot, True, result))
        except BaseException:
            out.put((slot, False, traceback.format_exc()))


class RankPool:
    """Worker processes that stay up between groups, so each group costs a rendezvous, not a
    Python and torch start-up per rank.

    Args:
        size: The most ranks a group may have.

    Example::

        with RankPool(3) as pool:
            pool.run(2, rank_and_world_size)          # [(0, 2), (1, 2)]
            pool.run(3, ("scenarios.py", "two_stage"), spec="comm:gloo", mode="sync")
    """

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.size = int(size)
        self._out = ctx.Queue()
        self._jobs = [ctx.Queue() for _ in range(self.size)]
        self._procs = [ctx.Process(target=_serve, args=(i, self._jobs[i], self._out), daemon=True) for i in range(self.size)]
        for p in self._procs:
            p.start()

    def run(
        self,
        world_size: int,
        target: Callable[..., Any] | tuple[str, str],
        spec: str = "comm:gloo",
        timeout_s: float = 60.0,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``target(backend, **kwargs)`` on ranks 0..world_size-1, each joined over ``spec``.

        Args:
            target: A module-level function, or ``(path, name)`` of one in a .py file.
            timeout_s: The backend's timeout; the group may take this long plus 30 s in all.

        Returns:
            The results in rank order.

        Raises:
            PipelineError: A rank raised (its traceback is in the message), died or timed out.
        """
        if not 1 <= world_size <= self.size:
            raise PipelineError(f"RankPool of {self.size} workers cannot run a group of {world_size}")
        port = free_port()
        for r in range(world_size):
            self._jobs[r].put((world_size, port, spec, timeout_s, target, kwargs))
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s + 30.0
        while len(results) + len(errors) < world_size:
            try:
                rank, ok, value = self._out.get(timeout=0.2)
            except queue.Empty:
                for r in range(world_size):
                    if r not in results and r not in errors and not self._procs[r].is_alive():
                        errors[r] = f"worker exited with code {self._procs[r].exitcode}"
                if time.monotonic() > deadline:
                    self.close()
                    missing = sorted(set(range(world_size)) - set(results) - set(errors))
                    raise PipelineError(f"RankPool: ranks {missing} did not answer within {timeout_s + 30:g} s") from None
                continue
            (results if ok else errors)[rank] = value
        if errors:
            raise PipelineError("RankPool: " + "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
        return [results[r] for r in range(world_size)]

    def close(self) -> None:
        """Stop the workers."""
        for q in self._jobs:
            try:
                q.put(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def spawn_group(
    world_size: int,
    target: Callable[..., Any] | tuple[str, str],
    spec: str = "comm:gloo",
    timeout_s: float = 60.0,
    **kwargs: Any,
) -> list[Any]:
    """Call ``target(backend, **kwargs)`` on ``world_size`` fresh processes joined over ``spec``
    (a one-off :class:`RankPool`)."""
    with RankPool(world_size) as pool:
        return pool.run(world_size, target, spec, timeout_s, **kwargs)


@attrs.frozen
class RankOutcome:
    """How one launched rank ended."""

    rank: int
    returncode: int
    output: str
    wall_s: float


def launch_script(
    script: str,
    world_size: int,
    args: Sequence[str] = (),
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> list[RankOutcome]:
    """Run ``python script args`` once per rank, as torchrun would on one node.

    Every rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
    rank 0 hosts the rendezvous store. A rank still running after ``timeout_s`` is killed and
    reported with return code -9.
    """
    port = free_port()
    start = time.monotonic()
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(world_size)]  # a pipe could fill and block
    procs = [
        subprocess.Popen([sys.executable, script, *args], env=rank_environ(r, world_size, port, env),
                         stdout=logs[r], stderr=subprocess.STDOUT, text=True)
        for r in range(world_size)
    ]
    ended: dict[int, tuple[int, float]] = {}
    deadline = start + timeout_s
    while len(ended) < world_size:
        for r, p in enumerate(procs):
            if r not in ended and p.poll() is not None:
                ended[r] = (p.returncode, time.monotonic() - start)
        if time.monotonic() > deadline:
            for r, p in enumerate(procs):
                if r not in ended:
                    p.kill()
                    p.wait()
                    ended[r] = (-9, time.monotonic() - start)
        time.sleep(0.02)
    outcomes = []
    for r, log in enumerate(logs):
        log.seek(0)
        outcomes.append(RankOutcome(r, ended[r][0], log.read(), ended[r][1]))
        log.close()
    return outcomes

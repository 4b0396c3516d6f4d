"""torch.distributed transports for pipelines: ``comm:gloo`` (CPUs) and ``comm:nccl`` (GPUs).

Both join the process group from the torchrun environment, or adopt one the program already
initialised. Tensors travel as their raw bytes (a ``uint8`` view, no copy), so every dtype
arrives bit for bit. A waiting rank stops with a ``PeerError`` when its peer's connection closes
(gloo), when a peer recorded a failure in the rendezvous store (``alchemi_nccl.signals``), or
after ``timeout_s``.

Example (under ``torchrun --nproc-per-node=2``)::

    from alchemi_core import registry
    backend = registry.build("comm:gloo", timeout_s=60)
    backend.init()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import torch

from alchemi_core.comm.base import CommBackend, PeerError, Work
from alchemi_core.errors import ConfigurationError, InvalidDataError, PipelineError
from alchemi_nccl.launch_env import LaunchEnv
from alchemi_nccl.signals import StoreSignals

#: Seconds between failure-record checks while an NCCL transfer is in flight.
POLL_CHECK_S = 0.5

_Staging = Callable[[torch.Tensor], "tuple[torch.Tensor, Callable[[], None] | None]"]


def wire_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat ``uint8`` view (no copy).

    Raises:
        InvalidDataError: The tensor is not contiguous (a view could not alias it).
    """
    if not tensor.is_contiguous():
        raise InvalidDataError(
            f"pipeline transfers need contiguous tensors, got shape {list(tensor.shape)} with strides "
            f"{list(tensor.stride())}; call .contiguous() first"
        )
    return tensor.reshape(-1).view(torch.uint8)


class _TorchWork(Work):
    """A torch.distributed work item, waited on with failure detection.

    Gloo's point-to-point work is complete only once waited on, so its first ``done()`` hands
    the wait to a helper thread (a GPU receive's copy from host memory still runs in ``wait()``).
    """

    def __init__(self, backend: TorchDistributedBackend, work: Any, peer: int, then: Callable[[], None] | None) -> None:
        self.backend, self.work, self.peer, self.then = backend, work, peer, then
        self._waiter: threading.Thread | None = None
        self._waited = threading.Event()
        self._error: BaseException | None = None

    def done(self) -> bool:
        if self.backend.polls_completion:
            return bool(self.work.is_completed())
        if self._waiter is None:
            self._waiter = threading.Thread(target=self._wait_in_thread, name="alchemi-wait", daemon=True)
            self._waiter.start()
        return self._waited.is_set()

    def _wait_in_thread(self) -> None:
        try:
            self.backend._wait(self.work, self.peer, None)
        except BaseException as exc:  # re-raised by wait() in the caller's thread
            self._error = exc
        finally:
            self._waited.set()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._waiter is not None:
            limit = self.backend.timeout_s if timeout_s is None else timeout_s
            if not self._waited.wait(limit + 1.0):
                who = f"rank {self.peer}"
                raise PeerError(f"comm:{self.backend.name}: no progress with {who} within {limit:g} s", self.peer)
            if self._error is not None:
                raise self._error
        else:
            self.backend._wait(self.work, self.peer, timeout_s)
        if self.then is not None:
            then, self.then = self.then, None
            then()


class TorchDistributedBackend(CommBackend):
    """A ``CommBackend`` over a torch.distributed process group (subclasses pick the transport).

    Args:
        timeout_s: Longest wait for a peer; also the process group's timeout.
        rank, world_size, local_rank, master_addr, master_port: Override the launcher's
            environment (default: read ``RANK``, ``WORLD_SIZE``, ... at ``init()``).
        heartbeat_s: Time between two heartbeats in the rendezvous store, and between two checks
            for a failure recorded by another rank.
    """

    name = "torch"
    #: The torch.distributed backend name.
    transport = ""
    #: Whether a transfer's ``is_completed()`` turns true without a wait (NCCL yes, gloo no).
    polls_completion = False

    def __init__(
        self,
        timeout_s: float = 120.0,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        heartbeat_s: float = 1.0,
    ) -> None:
        if float(timeout_s) <= 0:
            raise ConfigurationError(f"{self.name}: timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._overrides = {"rank": rank, "world_size": world_size, "local_rank": local_rank,
                           "master_addr": master_addr, "master_port": master_port}
        self.heartbeat_s = float(heartbeat_s)
        self.env: LaunchEnv | None = None
        self._owns_group = False
        self._signals = StoreSignals(None, 0, 1, self.timeout_s)

    def _launch_env(self) -> LaunchEnv:
        o: dict[str, Any] = self._overrides
        if o["rank"] is not None and o["world_size"] is not None:
            rank, world = int(o["rank"]), int(o["world_size"])
            local = int(o["local_rank"]) if o["local_rank"] is not None else rank
            if not 0 <= rank < world:
                raise ConfigurationError(f"{self.name}: rank {rank} is outside 0..{world - 1}")
            return LaunchEnv(rank, world, local, o["master_addr"], o["master_port"])
        changes = {k: v for k, v in o.items() if v is not None}
        return attrs.evolve(LaunchEnv.from_environ(), **changes)

    def _bind_device(self, env: LaunchEnv) -> None:
        """Select this rank's device before joining (NCCL)."""

    def _group_timeout_s(self) -> float:
        """The process group's own timeout."""
        return self.timeout_s

    def init(self) -> None:
        """Join the process group (idempotent); adopt one the program already initialised.

        Raises:
            ConfigurationError: The launcher's environment is missing or inconsistent, or the
                initialised group uses another transport.
            PipelineError: The other ranks did not join within ``timeout_s``.
        """
        if self.env is not None:
            return
        import torch.distributed as dist

        if not dist.is_available():
            raise ConfigurationError(f"{self.name}: this torch build has no torch.distributed")
        if dist.is_initialized():
            current = str(dist.get_backend())
            if self.transport not in current:
                raise ConfigurationError(
                    f"comm:{self.name} found a process group using {current!r}; use comm:{current} or "
                    "destroy the group first"
                )
            rank, world = dist.get_rank(), dist.get_world_size()
            local = self._overrides["local_rank"]
            env = LaunchEnv(rank, world, int(local) if local is not None else int(os.environ.get("LOCAL_RANK", rank)))
            self._bind_device(env)
            self._owns_group = False
        else:
            env = self._launch_env()
            self._bind_device(env)
            init_method = "env://"
            if env.master_addr is not None and env.master_port is not None:
                init_method = f"tcp://{_bracket(env.master_addr)}:{env.master_port}"
            try:
                dist.init_process_group(
                    backend=self.transport, init_method=init_method, rank=env.rank, world_size=env.world_size,
                    timeout=timedelta(seconds=self._group_timeout_s()),
                )
            except (RuntimeError, ValueError) as exc:
                raise PipelineError(
                    f"comm:{self.name} rank {env.rank}: could not join the process group of {env.world_size} "
                    f"at {env.master_addr}:{env.master_port} within {self.timeout_s:g} s ({exc}); are all "
                    "ranks started with the same MASTER_ADDR/MASTER_PORT?"
                ) from exc
            self._owns_group = True
        self.env = env
        self._signals = StoreSignals(
            _default_store(), env.rank, env.world_size, self.timeout_s, self.heartbeat_s,
            hosts_store=env.rank == 0 and not _agent_store(),
        )
        self._signals.start()

    def _require(self) -> LaunchEnv:
        if self.env is None:
            raise ConfigurationError(f"comm:{self.name} is not initialised; call init() first")
        return self.env

    @property
    def rank(self) -> int:
        return self._require().rank

    @property
    def world_size(self) -> int:
        return self._require().world_size

    def shutdown(self) -> None:
        """Leave the process group (only one this backend created)."""
        import torch.distributed as dist

        self._signals.stop()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False
        self.env = None

    def abort(self) -> None:
        """Leave the process group at once after a failure, without waiting on peers."""
        import torch.distributed as dist

        self._signals.stop()
        if self._owns_group and dist.is_initialized():
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            try:
                if abort is not None and self.transport == "nccl":
                    abort()
                else:
                    dist.destroy_process_group()
            except Exception:
                pass
        self._owns_group = False
        self.env = None

    def isend_tensor(self, tensor: torch.Tensor, dst: int) -> Work:
        import torch.distributed as dist

        return self._post(dist.isend, tensor, dst, self._stage_send)

    def irecv_tensor(self, tensor: torch.Tensor, src: int) -> Work:
        import torch.distributed as dist

        return self._post(dist.irecv, tensor, src, self._stage_recv)

    def _post(self, op: Callable[..., Any], tensor: torch.Tensor, peer: int, stage: _Staging) -> Work:
        payload, then = stage(wire_view(tensor))
        try:
            work = op(payload, peer)
        except RuntimeError as exc:
            raise self._lost(peer, exc) from exc
        return _TorchWork(self, work, peer, then)

    def _stage_send(self, payload: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Where the bytes to send must be (subclasses may copy them to host memory)."""
        return payload, None

    def _stage_recv(self, payload: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Where to receive, and what to do once the bytes are there."""
        return payload, None

    def _wait(self, work: Any, peer: int | None, timeout_s: float | None) -> None:
        """Block until ``work`` completed (gloo: the transport's own wait and timeout)."""
        try:
            if timeout_s is None:
                work.wait()
            else:
                work.wait(timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise self._lost(peer, exc) from exc

    def _lost(self, peer: int | None, exc: BaseException) -> PeerError:
        origin = self._signals.failure()
        who = f"rank {peer}" if peer is not None else "a peer"
        if origin is not None:
            me = self.env.rank if self.env else None
            # A record that blames this rank (the others gave up on it): it lost the link's peer.
            blamed = origin[0] if origin[0] != me else peer
            return PeerError(f"{origin[1]} (seen by rank {me if me is not None else '?'} through {who})", blamed)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return PeerError(f"comm:{self.name}: lost {who}: {text}", peer)

    def _flag_tensor(self, value: int) -> torch.Tensor:
        return torch.tensor([int(value)], dtype=torch.int64, device=self.device)

    def _all_reduce(self, value: int, op: Any) -> int:
        import torch.distributed as dist

        t = self._flag_tensor(value)
        try:
            work = dist.all_reduce(t, op=op, async_op=True)
        except RuntimeError as exc:
            raise self._lost(None, exc) from exc
        self._wait(work, None, None)
        return int(t.cpu()[0])

    def all_reduce_max(self, value: int) -> int:
        import torch.distributed as dist

        return self._all_reduce(value, dist.ReduceOp.MAX)

    def all_reduce_sum(self, value: int) -> int:
        import torch.distributed as dist

        return self._all_reduce(value, dist.ReduceOp.SUM)

    def barrier(self) -> None:
        self.all_reduce_max(0)

    def notify_failure(self, message: str, rank: int | None = None) -> None:
        self._signals.notify(message, rank)

    def peer_failure(self) -> str | None:
        origin = self._signals.failure()
        return origin[1] if origin is not None else None

    def heartbeat(self) -> None:
        self._signals.beat()

    def check_peers(self) -> None:
        self._signals.watch_all()

    def finish(self) -> None:
        self._signals.finish()

    def __repr__(self) -> str:
        where = f"rank {self.env.rank}/{self.env.world_size}" if self.env else "not initialised"
        return f"{type(self).__name__}({where}, timeout_s={self.timeout_s:g})"


class GlooBackend(TorchDistributedBackend):
    """``comm:gloo``: TCP between CPU processes (tensors on a GPU are staged through host memory).

    A peer that exits or crashes closes its sockets, so a rank waiting on it stops at once; a
    peer that hangs is given up after ``timeout_s``.
    """

    name = "gloo"
    transport = "gloo"

    def __init__(self, timeout_s: float = 120.0, **kwargs: Any) -> None:
        super().__init__(timeout_s, **kwargs)
        self._staging: dict[tuple[int, int], torch.Tensor] = {}

    def _host_copy_of(self, payload: torch.Tensor) -> torch.Tensor:
        key = (payload.data_ptr(), payload.numel())
        host = self._staging.get(key)
        if host is None:  # once per buffer: pipeline frames are allocated once
            host = torch.empty(payload.numel(), dtype=torch.uint8, pin_memory=True)
            self._staging[key] = host
        return host

    def _stage_send(self, payload: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        if payload.device.type == "cpu":
            return payload, None
        host = self._host_copy_of(payload)
        host.copy_(payload)
        return host, None

    def _stage_recv(self, payload: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        if payload.device.type == "cpu":
            return payload, None
        host = self._host_copy_of(payload)
        return host, lambda: payload.copy_(host)


class NcclBackend(TorchDistributedBackend):
    """``comm:nccl``: NVLink/InfiniBand/sockets between GPUs, one GPU per rank (``LOCAL_RANK``).

    The group is joined without ``device_id``, so communicators are made lazily: a two-rank one
    per neighbouring pair on its first transfer, the world one on the first flag reduction. While
    a transfer is in flight the host polls it and, every ``POLL_CHECK_S``, the failure record and
    the peer's heartbeat, so a rank whose peer failed stops within seconds, not at NCCL's timeout.
    """

    name = "nccl"
    transport = "nccl"
    polls_completion = True
    #: Extra seconds on the process group's timeout, so the backend's own, clearer error comes first.
    WATCHDOG_MARGIN_S = 30.0

    def _bind_device(self, env: LaunchEnv) -> None:
        if not torch.cuda.is_available():
            raise ConfigurationError("comm:nccl needs CUDA GPUs; on CPUs use comm:gloo")
        count = torch.cuda.device_count()
        if env.local_rank >= count:
            raise ConfigurationError(
                f"comm:nccl rank {env.rank} has LOCAL_RANK={env.local_rank} but this node shows {count} "
                "GPUs; NCCL needs one GPU per rank (start at most that many processes per node)"
            )
        torch.cuda.set_device(env.local_rank)

    def _group_timeout_s(self) -> float:
        return self.timeout_s + self.WATCHDOG_MARGIN_S

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self._require().local_rank)

    def _wait(self, work: Any, peer: int | None, timeout_s: float | None) -> None:
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        next_check = start + POLL_CHECK_S
        delay = 2e-5
        try:
            while not work.is_completed():
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + POLL_CHECK_S
                    self._signals.watch(peer)  # NCCL never notices a dead peer by itself
                if now - start > limit:
                    who = f"rank {peer}" if peer is not None else "the other ranks"
                    raise PeerError(f"comm:nccl: no progress with {who} within {limit:g} s", peer)
                time.sleep(delay)
                delay = min(1e-3, delay * 2)
            work.wait()
        except RuntimeError as exc:
            raise self._lost(peer, exc) from exc


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _default_store() -> Any:
    """The process group's rendezvous store, or None when torch does not expose it."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return getter() if getter is not None else None
    except Exception:
        return None


__all__ = ["GlooBackend", "NcclBackend", "TorchDistributedBackend", "wire_view"]

"""Where this process sits in a launched job: the torchrun environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), read once.

Example:
    >>> from alchemi_nccl.launch_env import LaunchEnv
    >>> env = LaunchEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
    ...                               "MASTER_PORT": "29500"})
    >>> env.rank, env.world_size, env.local_rank
    (1, 2, 1)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from alchemi_core.errors import ConfigurationError

_LAUNCH_HINT = (
    "launch one process per stage with torchrun, e.g. `torchrun --nproc-per-node=2 script.py` "
    "(see docs/pipelines.md)"
)


@attrs.frozen
class LaunchEnv:
    """Rank, world size, local rank and rendezvous address of this process.

    Attributes:
        rank: Global rank, 0..world_size-1.
        world_size: Number of processes in the job.
        local_rank: Rank on this node (selects the GPU).
        master_addr: Host of the rendezvous store (None: the launcher's ``env://`` default).
        master_port: Port of the rendezvous store.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read the launcher's variables.

        Raises:
            ConfigurationError: A variable is missing or not a number, or the rank is out of range.
        """
        env = os.environ if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ConfigurationError(f"the torchrun environment is incomplete: {missing} not set; {_LAUNCH_HINT}")
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local = int(env.get("LOCAL_RANK", rank))
            port = int(env["MASTER_PORT"])
        except ValueError as exc:
            raise ConfigurationError(f"the torchrun environment has a non-numeric value ({exc}); {_LAUNCH_HINT}") from None
        if not 0 <= rank < world:
            raise ConfigurationError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
        if local < 0:
            raise ConfigurationError(f"LOCAL_RANK={local} must be >= 0")
        return cls(rank=rank, world_size=world, local_rank=local, master_addr=env["MASTER_ADDR"], master_port=port)

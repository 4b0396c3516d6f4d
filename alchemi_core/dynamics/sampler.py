"""``SizeAwareSampler``: hand out structures from a dataset so batches stay within atom, edge and
system budgets, for inflight batching.

Structures are grouped into bins of ``bin_width`` atoms. A request for a replacement with a
budget of ``num_atoms``/``num_edges`` takes the largest structure that fits (best fit keeps the
batch full); the initial batch is packed greedily the same way. Every structure is handed out
exactly once; one that could never fit the budgets is rejected when the sampler is made, with
its index, not skipped.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData
    >>> from alchemi_core.data.datapipes import ListDataset
    >>> from alchemi_core.dynamics import SizeAwareSampler
    >>> ds = ListDataset([AtomicData(atomic_numbers=torch.ones(n, dtype=torch.long),
    ...                              positions=torch.zeros(n, 3)) for n in (3, 5, 8, 2)])
    >>> sampler = SizeAwareSampler(ds, max_atoms=12, max_edges=None, max_batch_size=3, bin_width=2)
    >>> batch = sampler.build_initial_batch()
    >>> batch.num_nodes_list, sampler.exhausted
    ([8, 3], False)
    >>> sampler.request_replacement(num_atoms=2, num_edges=0).num_nodes
    2
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import all_metadata, all_system_ids, as_atomic_data
from alchemi_core.dynamics import build_pool
from alchemi_core.dynamics.build_pool import BuildPool, Pending
from alchemi_core.dynamics.device_memory import BYTES_PER_ATOM_ESTIMATE, MemoryPlan
from alchemi_core.dynamics.identity import check_dataset_ids
from alchemi_core.dynamics.size_bins import SizeBins
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.validation import whole_number

#: Structures a sampler builds ahead of their request, at most (:meth:`SizeAwareSampler.prefetch`).
DEFAULT_PREFETCH = 4096
#: Structures of each size bin built ahead first: what fills the gaps a refill leaves.
PREFETCH_HEADS = 4
#: Then what refills of this many whole batches would take.
PREFETCH_BATCHES = 1
#: Atoms built ahead, at most (host memory: about 50 bytes per atom of a plain structure).
PREFETCH_MAX_ATOMS = 2_000_000


class SizeAwareSampler:
    """Bin-packing access to a dataset (see the module docstring).

    Args:
        dataset: ``__len__``, ``__getitem__`` and ``get_metadata(i) -> (num_atoms, num_edges)``.
        max_atoms: Most atoms in a batch (None: planned from the memory of the device the run
            uses, free GPU memory or available RAM, and the models' bytes per atom; see
            :meth:`plan_memory`).
        max_edges: Most edges in a batch (None: no limit).
        max_batch_size: Most systems in a batch (None: no limit).
        bin_width: Atoms per size bin.
        shuffle: Hand out structures of a bin in random order (``seed``) instead of index order.
        max_gpu_memory_fraction: Share of the device's free memory (RAM on a CPU) a batch may
            be planned to use.
        seed: Seed of the shuffle.
        prefetch: Most structures built ahead of their request (:meth:`prefetch`; 0: none).
        workers: Processes that build the structures (0: this process), for a dataset that makes
            its structures when asked (:mod:`~alchemi_core.dynamics.build_pool`); the same
            structures in the same order, packed by ``get_metadata``'s sizes (exact edges needed).
    """

    def __init__(
        self,
        dataset: Any,
        max_atoms: int | None = None,
        max_edges: int | None = None,
        max_batch_size: int | None = None,
        bin_width: int = 10,
        shuffle: bool = False,
        max_gpu_memory_fraction: float = 0.8,
        seed: int = 0,
        prefetch: int = DEFAULT_PREFETCH,
        workers: int = 0,
    ) -> None:
        bin_width = whole_number("SizeAwareSampler bin_width", bin_width, minimum=1)
        if max_atoms is not None:
            max_atoms = whole_number("SizeAwareSampler max_atoms", max_atoms, minimum=1, none_means="auto")
        if max_edges is not None:
            max_edges = whole_number("SizeAwareSampler max_edges", max_edges, minimum=0, none_means="no limit")
        if max_batch_size is not None:
            max_batch_size = whole_number("SizeAwareSampler max_batch_size", max_batch_size, minimum=1,
                                          none_means="no limit")
        if not 0 < max_gpu_memory_fraction <= 1:
            raise ConfigurationError("max_gpu_memory_fraction must be in (0, 1]")
        self.dataset = dataset
        self.prefetch_limit = whole_number("SizeAwareSampler prefetch", prefetch, minimum=0)
        self.workers = whole_number("SizeAwareSampler workers", workers, minimum=0)
        #: Structures sent to the workers so far (ahead of their request or with it).
        self.worker_builds = 0
        self._pool: BuildPool | None = None
        #: Structures built ahead (or on their way from a worker), by (index, stored), or the
        #: error building one raised.
        self._ready: dict[tuple[int, bool], AtomicData | Exception | Pending] = {}
        #: Structures built ahead so far (:meth:`prefetch`).
        self.prefetched = 0
        self.bin_width = int(bin_width)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.max_gpu_memory_fraction = float(max_gpu_memory_fraction)
        #: True when ``max_atoms`` was planned from the device's memory (and may be planned
        #: again from the models' own per-atom estimates, :meth:`plan_memory`, before the run starts).
        self.sized_from_memory = max_atoms is None
        #: Device bytes per atom the plan assumed, and the last plan (None: none made).
        self.bytes_per_atom = float(BYTES_PER_ATOM_ESTIMATE)
        self.memory: MemoryPlan | None = None
        self.max_edges = int(max_edges) if max_edges is not None else None
        self.max_batch_size = int(max_batch_size) if max_batch_size is not None else None
        self._atoms, self._edges = all_metadata(dataset)
        self.max_atoms = int(max_atoms) if max_atoms is not None else self._auto_max_atoms()
        if self.max_atoms < 1 or (self.max_batch_size is not None and self.max_batch_size < 1):
            raise ConfigurationError("max_atoms and max_batch_size must be >= 1")
        self._check_fits()
        ids = all_system_ids(dataset)
        if ids is not None:
            check_dataset_ids(ids, f"the dataset {type(dataset).__name__}")
        #: The ``system_id`` of each structure (its position when the dataset does not say).
        self.system_ids = ids if ids is not None else np.arange(len(self._atoms), dtype=np.int64)
        self._reset_bins()

    # ------------------------------------------------------------------ setup
    def _auto_max_atoms(self, chunk_atoms: int | None = None, needed_by: str = "a simulation") -> int:
        # Planned for the dataset's device, else a GPU when there is one.
        device = torch.device(self._device() or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.memory = MemoryPlan.of(device, self.max_gpu_memory_fraction, self.bytes_per_atom, chunk_atoms, needed_by)
        return self.memory.max_atoms(int(self._atoms.max()) if len(self._atoms) else 1)

    def plan_memory(self, bytes_per_atom: float, chunk_atoms: int | None = None, needed_by: str = "the model") -> int:
        """Plan ``max_atoms`` for models that need ``bytes_per_atom`` device bytes per atom of
        the ``chunk_atoms`` atoms they evaluate at once (None: the whole batch), before the first
        batch: a sampler built with ``max_atoms=None`` plans again, one given ``max_atoms`` checks
        that its largest batch fits.

        Raises:
            ConfigurationError: That batch, or a chunk of ``chunk_atoms``, does not fit the
                device's memory (the message gives the value that fits).
            InvalidDataError: A structure does not fit the memory alone.
        """
        if self._handed or not bytes_per_atom > 0:
            return self.max_atoms
        self.bytes_per_atom = float(bytes_per_atom)
        planned = self._auto_max_atoms(chunk_atoms, needed_by)
        if self.sized_from_memory:
            self.max_atoms = planned
            self._check_fits()
        else:
            sizes = np.sort(self._atoms)[::-1][: self.max_batch_size]
            assert self.memory is not None
            self.memory.check_max_atoms(self.max_atoms, min(self.max_atoms, int(sizes.sum())))
        return self.max_atoms

    def _check_fits(self) -> None:
        too_big = np.nonzero(self._atoms > self.max_atoms)[0]
        if len(too_big):
            i = int(too_big[0])
            limit, fix = ((f"a batch of at most {self.max_atoms} atoms fits the memory of {self.memory}",
                           "free memory, run on a device with more") if self.sized_from_memory else
                          (f"max_atoms is {self.max_atoms}", "raise max_atoms"))
            raise InvalidDataError(
                f"structure {i} has {int(self._atoms[i])} atoms but {limit} ({len(too_big)} structures are "
                f"too large); {fix}, or remove them"
            )
        if self.max_edges is not None:
            too_many = np.nonzero(self._edges > self.max_edges)[0]
            if len(too_many):
                i = int(too_many[0])
                raise InvalidDataError(
                    f"structure {i} has {int(self._edges[i])} edges but max_edges is {self.max_edges}; "
                    "raise max_edges or remove it"
                )

    def _reset_bins(self, handed_out: np.ndarray | None = None) -> None:
        order = np.arange(len(self._atoms), dtype=np.int64)
        if self.shuffle:
            order = np.random.default_rng(self.seed).permutation(order)
        if handed_out is not None:
            order = order[~np.isin(order, handed_out)]
        self._bins = SizeBins(self._atoms, self._edges, self.bin_width, order.tolist())
        self._handed: list[int] = [] if handed_out is None else handed_out.tolist()
        self._ready = {}
        #: What :meth:`prefetch` builds, in order, how far it got, and after how many handed out.
        self._plan: Iterator[int] = iter(())
        self._plan_at = -1

    def batch_capacity(self) -> tuple[int, int]:
        """The most systems and edges a batch of this sampler's budgets can hold (the room the
        engine's active batch is given)."""
        atoms, edges = self._atoms, self._edges
        systems = self.max_batch_size or len(self)
        systems = min(systems, self.max_atoms // max(1, int(atoms.min()) if len(atoms) else 1))
        if self.max_edges is not None:
            return systems, self.max_edges
        # the most edges that many systems can bring
        return systems, int(np.sort(edges)[::-1][:systems].sum()) if len(edges) else 0

    # ------------------------------------------------------------------ state
    def __len__(self) -> int:
        return len(self._atoms)

    @property
    def remaining(self) -> int:
        """Structures not handed out yet."""
        return len(self._bins)

    @property
    def exhausted(self) -> bool:
        """True once every structure has been handed out."""
        return self.remaining == 0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the sampler (plain data): the positions handed out
        and their ``system_id``s."""
        handed = np.asarray(self._handed, dtype=np.int64)
        return {"handed_out": list(self._handed), "handed_out_ids": self.system_ids[handed].tolist(),
                "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. Structures are matched by ``system_id`` where the state names
        them, so the sampler may hold fewer structures than the one that was saved (a rerun that
        left out those stored since): the handed-out ones it does not hold are skipped."""
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        handed = np.asarray(state["handed_out"], dtype=np.int64)
        ids = state.get("handed_out_ids")
        if ids is not None:
            position = {int(sid): i for i, sid in enumerate(self.system_ids.tolist())}
            handed = np.asarray([position[i] for i in map(int, ids) if i in position], dtype=np.int64)
        self._reset_bins(handed)

    # ------------------------------------------------------------------ handing out
    def _take(self, num_atoms: int, num_edges: int | None) -> int | None:
        """Index of the largest remaining structure within the budgets, removed from its bin."""
        i = self._bins.take(num_atoms, num_edges)
        if i is not None:
            self._handed.append(i)
        return i

    def prefetch(self, stored: bool = True) -> bool:
        """Build one structure that a coming request will likely take; False when there is none
        to build (every likely one is ready, or ``prefetch`` of them are).

        The engine calls it while a check waits for the GPU, so that a dataset that builds its
        structures on request does so while the GPU steps (:meth:`_likely` says which). A
        structure whose building raises raises when it is requested, as it would without this.
        """
        if len(self._ready) >= self.prefetch_limit:
            return False
        if self._plan_at != len(self._handed):  # something was handed out: plan again
            # A generator, followed only as far as structures are built (it reads the bins live).
            self._plan, self._plan_at = self._likely(), len(self._handed)
        if self.workers:  # a chunk of the plan to the workers: they build while the host goes on
            room = min(build_pool.CHUNK, self.prefetch_limit - len(self._ready))
            chunk: list[int] = []
            for i in self._plan:  # (the plan names a bin's first structures twice)
                if (i, stored) not in self._ready and i not in chunk:
                    chunk.append(i)
                    if len(chunk) >= room:
                        break
            self._submit(chunk, stored)
            self.prefetched += len(chunk)
            return bool(chunk)
        for i in self._plan:
            key = (i, stored)
            if key in self._ready:
                continue
            self.prefetched += 1
            try:
                self._ready[key] = self._build(i, stored)
            except Exception as exc:  # noqa: BLE001 - raised again when it is requested
                self._ready[key] = exc
            return True
        return False

    def _submit(self, indices: list[int], stored: bool) -> None:
        """Send ``indices`` to the workers (started at the first call)."""
        if not indices:
            return
        if self._pool is None:
            self._pool = BuildPool(self.dataset, self.workers)
            weakref.finalize(self, self._pool.close)
        for i, pending in zip(indices, self._pool.submit(indices, stored), strict=True):
            self._ready[(i, stored)] = pending
        self.worker_builds += len(indices)

    def close(self) -> None:
        """Stop the workers, if any (a later request starts them again)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._ready = {k: v for k, v in self._ready.items() if not isinstance(v, Pending)}

    def _likely(self) -> Iterator[int]:
        """The structures coming requests will likely take, most likely first
        (:meth:`SizeBins.likely` with ``PREFETCH_HEADS`` and ``PREFETCH_BATCHES`` batches)."""
        atoms = min(PREFETCH_BATCHES * self.max_atoms, PREFETCH_MAX_ATOMS)
        return self._bins.likely(PREFETCH_HEADS, atoms, self.prefetch_limit)

    def _build(self, index: int, stored: bool) -> AtomicData:
        get_stored = getattr(self.dataset, "get_stored", None) if stored else None
        item = get_stored(index) if get_stored is not None else self.dataset[index]
        return as_atomic_data(item, index)

    def _load(self, index: int, stored: bool = False) -> AtomicData:
        ready = self._ready.pop((index, stored), None)
        self._ready.pop((index, not stored), None)  # built for the other kind of request
        if isinstance(ready, Exception):
            raise ready
        if isinstance(ready, Pending):
            ready = ready.result()
            if not self._bins and not any(isinstance(v, Pending) for v in self._ready.values()):
                self.close()  # every structure handed out and back: the workers are done
        data = ready if ready is not None else self._build(index, stored)
        if data.num_nodes != self._atoms[index]:
            raise InvalidDataError(
                f"structure {index} has {data.num_nodes} atoms but get_metadata said "
                f"{int(self._atoms[index])}; the dataset's metadata is stale"
            )
        if self.workers and data.num_edges != self._edges[index]:  # requests were packed by it
            raise InvalidDataError(
                f"structure {index} has {data.num_edges} edges but get_metadata said "
                f"{int(self._edges[index])}; with workers a dataset's metadata must give every "
                "structure's edges exactly"
            )
        if "system_id" not in data:
            # A copy: the dataset's own structure (maybe listed twice) stays as it was.
            data = data.with_system_id(index)
        return data

    def request_replacement(self, num_atoms: int, num_edges: int | None = None) -> AtomicData | None:
        """The largest remaining structure with at most ``num_atoms`` atoms and ``num_edges``
        edges, or None when none fits (or the dataset is exhausted)."""
        return self._next(num_atoms, num_edges, stored=False)

    def _next(self, num_atoms: int, num_edges: int | None, stored: bool) -> AtomicData | None:
        i = self._take(int(num_atoms), None if num_edges is None else int(num_edges))
        return None if i is None else self._load(i, stored)

    def request_many(self, max_systems: int, num_atoms: int, num_edges: int | None) -> list[AtomicData]:
        """Greedily take structures while systems, atoms and edges remain in the budgets."""
        return self._many(max_systems, num_atoms, num_edges, stored=False)

    def _many(self, max_systems: int, num_atoms: int, num_edges: int | None, stored: bool) -> list[AtomicData]:
        if not self.workers:
            out: list[AtomicData] = []
            while len(out) < max_systems:
                data = self._next(num_atoms, num_edges, stored)
                if data is None:
                    break
                out.append(data)
                num_atoms -= data.num_nodes
                if num_edges is not None:
                    num_edges -= data.num_edges
            return out
        # With workers: take them all by their sizes, send those not built yet at once, collect in order.
        taken: list[int] = []
        while len(taken) < max_systems:
            i = self._take(num_atoms, num_edges)
            if i is None:
                break
            taken.append(i)
            num_atoms -= int(self._atoms[i])
            if num_edges is not None:
                num_edges -= int(self._edges[i])
        self._submit([i for i in taken if (i, stored) not in self._ready and (i, not stored) not in self._ready],
                     stored)
        return [self._load(i, stored) for i in taken]

    def request_batch(
        self, max_systems: int, num_atoms: int, num_edges: int | None, device: torch.device | str | None = None
    ) -> Batch | None:
        """:meth:`request_many`'s structures as one batch on ``device`` (default: the dataset's
        ``device``, else where the structures are), or None when none fits.

        A dataset with ``get_stored(i)`` (``ListDataset``, ``Dataset``) hands its structures over
        where they are held and the batch copies each field to the device once.
        """
        data = self._many(max_systems, num_atoms, num_edges, stored=True)
        if not data:
            return None
        return Batch.from_data_list(data, device=device if device is not None else self._device())

    def _device(self) -> torch.device | str | None:
        """Where the dataset puts its structures (None: where they are held)."""
        return getattr(self.dataset, "device", None)

    def build_initial_batch(self, device: torch.device | str | None = None) -> Batch:
        """A batch packed greedily up to ``max_batch_size`` systems, ``max_atoms`` atoms and
        ``max_edges`` edges, on ``device`` (default: the dataset's).

        Raises:
            RuntimeError: The dataset is empty or exhausted.
        """
        systems = self.max_batch_size if self.max_batch_size is not None else len(self)
        batch = self.request_batch(systems, self.max_atoms, self.max_edges, device)
        if batch is None:
            raise RuntimeError("SizeAwareSampler has no structures left to build a batch from")
        return batch

    def __repr__(self) -> str:
        return (
            f"SizeAwareSampler({len(self)} structures, {self.remaining} left, max_atoms={self.max_atoms}, "
            f"max_edges={self.max_edges}, max_batch_size={self.max_batch_size})"
        )

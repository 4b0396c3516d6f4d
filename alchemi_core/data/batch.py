"""``Batch``: many structures in one set of tensors, with room to grow in place.

Atom and edge rows of all systems are concatenated; system rows are stacked; per-system counts
give the segments. A batch may hold *capacity* beyond its contents (``Batch.empty``): tensors are
allocated once, and ``put``/``defrag``/``zero`` move rows inside them, so a buffer's memory and a
captured CUDA graph's addresses stay fixed. Field access returns views of the filled rows.

Every operation works for every dtype: integer atomic numbers, bool masks, float32 and float64.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> a = AtomicData(atomic_numbers=torch.tensor([1, 1]), positions=torch.zeros(2, 3))
    >>> b = AtomicData(atomic_numbers=torch.tensor([8]), positions=torch.ones(1, 3))
    >>> batch = Batch.from_data_list([a, b])
    >>> batch.num_graphs, batch.num_nodes, batch.batch_idx.tolist()
    (2, 3, [0, 0, 1])
    >>> buf = Batch.empty(num_systems=4, num_nodes=10, num_edges=0, template=batch)
    >>> buf.put(batch, torch.tensor([False, True]))
    1
    >>> batch.defrag().num_graphs, buf.atomic_numbers.tolist()
    (1, [8])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data.atomic_data import AtomicData
from alchemi_core.data.buffer_ops import BufferOps, buffer_ops_for
from alchemi_core.data.fields import INDEX_FIELDS, Level, infer_level
from alchemi_core.data.values import check_values
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    import ase

_NODE, _EDGE, _SYS = Level.NODE, Level.EDGE, Level.SYSTEM
_ORDER = (_SYS, _NODE, _EDGE)  # the order of _n and _cap


def _segment_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(starts[i], starts[i] + counts[i])`` for every i, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return offsets + np.arange(total, dtype=np.int64)


def _ptr(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


class Batch:
    """A batch of atomic systems stored as concatenated segments (see the module docstring).

    Build one with :meth:`from_data_list`, :meth:`empty` or :meth:`from_atoms`; read fields as
    attributes (``batch.positions``); assign them the same way (``batch.forces = f``), which
    stores a new tensor at the level its name or shape shows.
    """

    # ------------------------------------------------------------------ construction
    def __init__(self, *, device: torch.device | str = "cpu") -> None:
        d = self.__dict__
        d["_store"] = {}
        d["_level"] = {}
        d["_n"] = [0, 0, 0]  # systems, atoms, edges held
        d["_cap"] = [0, 0, 0]  # rows allocated
        d["_ncount"] = np.zeros(0, dtype=np.int64)  # atoms per system (host copy, no syncs)
        d["_ecount"] = np.zeros(0, dtype=np.int64)
        d["_device"] = torch.device(device)
        d["_views"] = {}
        d["_derived"] = {}
        d["_version"] = 0
        d["_copied_mask"] = None
        d["_dest_mask"] = None
        d["_pending_defrag"] = None

    @classmethod
    def from_data_list(
        cls, data_list: Sequence[AtomicData], device: torch.device | str | None = None
    ) -> Batch:
        """Concatenate structures into one batch.

        Args:
            data_list: One or more ``AtomicData`` with the same fields and dtypes.
            device: Where the batch lives; default the first structure's device.

        Raises:
            InvalidDataError: Empty list, or structures whose fields or dtypes differ.
        """
        if len(data_list) == 0:
            raise InvalidDataError("Batch.from_data_list needs at least one AtomicData")
        first = data_list[0]
        if not isinstance(first, AtomicData):
            raise InvalidDataError(f"item 0 of data_list is a {type(first).__name__}, not AtomicData")
        keys = first.keys()
        levels = first.levels
        # Compares dict views and dtypes only: a refill pays this per structure.
        names = first._fields.keys()
        dtypes = [(k, first._fields[k].dtype) for k in keys]
        for i, d in enumerate(data_list):
            if not isinstance(d, AtomicData):
                raise InvalidDataError(f"item {i} of data_list is a {type(d).__name__}, not AtomicData")
            fields = d._fields
            if fields.keys() != names:
                missing = sorted(set(keys) ^ set(fields))
                raise InvalidDataError(
                    f"structure {i} differs from structure 0 in fields {missing}; every structure "
                    "in a batch needs the same fields"
                )
            for k, dtype in dtypes:
                if fields[k].dtype != dtype:
                    raise InvalidDataError(
                        f"field {k!r} is {fields[k].dtype} in structure {i} but "
                        f"{dtype} in structure 0; convert them to one dtype"
                    )
        dev = torch.device(device) if device is not None else first.device
        batch = cls(device=dev)
        ncount = np.array([d.num_nodes for d in data_list], dtype=np.int64)
        ecount = np.array([d.num_edges for d in data_list], dtype=np.int64)
        nptr = _ptr(ncount)
        for k in keys:
            parts = [d._fields[k] for d in data_list]
            if k in INDEX_FIELDS:
                parts = [p + int(nptr[i]) for i, p in enumerate(parts)]
            try:
                # Concatenated where they are, then one copy per field (not one per structure).
                joined = torch.cat(parts, dim=0)
            except RuntimeError:
                if len({p.device for p in parts}) == 1:
                    raise  # not a matter of devices: shapes that do not stack
                joined = torch.cat([p.to(dev) for p in parts], dim=0)
            batch._store[k] = joined.to(dev)
            batch._level[k] = levels[k]
        batch._set_counts(len(data_list), ncount, ecount, exact=True)
        return batch

    @classmethod
    def from_segments(
        cls,
        fields: Mapping[str, torch.Tensor],
        levels: Mapping[str, Level | str],
        num_nodes: Sequence[int] | np.ndarray,
        num_edges: Sequence[int] | np.ndarray | None = None,
        device: torch.device | str | None = None,
    ) -> Batch:
        """A batch from already-concatenated fields and per-system sizes, without per-system copies
        (what storage readers and transports need to rebuild a batch in one go).

        Args:
            fields: Field tensors: atom fields with ``sum(num_nodes)`` rows, edge fields with
                ``sum(num_edges)`` rows, system fields with ``len(num_nodes)`` rows. Index fields
                (``neighbor_list``) hold batch-global atom indices, as in any batch.
            levels: The level of every field.
            num_nodes: Atoms per system.
            num_edges: Edges per system (default: none).
            device: Where the batch lives (default: the first field's device).

        Raises:
            InvalidDataError: A field's rows do not match its level, or a level is missing.

        Example:
            >>> import torch
            >>> b = Batch.from_segments(
            ...     {"atomic_numbers": torch.tensor([1, 1, 8]), "positions": torch.zeros(3, 3)},
            ...     {"atomic_numbers": "node", "positions": "node"}, num_nodes=[2, 1])
            >>> b.num_graphs, b.batch_idx.tolist()
            (2, [0, 0, 1])
        """
        ncount = np.asarray(num_nodes, dtype=np.int64).reshape(-1)
        nsys = len(ncount)
        ecount = np.zeros(nsys, np.int64) if num_edges is None else np.asarray(num_edges, dtype=np.int64).reshape(-1)
        if len(ecount) != nsys or (nsys and min(ncount.min(), ecount.min()) < 0):
            raise InvalidDataError(
                f"Batch.from_segments: num_nodes and num_edges need one non-negative count per system "
                f"({nsys}), got {len(ecount)} edge counts"
            )
        rows = {_NODE: int(ncount.sum()), _EDGE: int(ecount.sum()), _SYS: nsys}
        dev = torch.device(device) if device is not None else (
            next(iter(fields.values())).device if fields else torch.device("cpu")
        )
        batch = cls(device=dev)
        for name, t in fields.items():
            if name not in levels:
                raise InvalidDataError(f"Batch.from_segments: no level given for field {name!r}")
            lvl = Level(levels[name])
            if t.dim() == 0 or t.shape[0] != rows[lvl]:
                raise InvalidDataError(
                    f"Batch.from_segments: {lvl.value} field {name!r} needs {rows[lvl]} rows, "
                    f"got shape {list(t.shape)}"
                )
            batch._store[name] = t.to(dev)
            batch._level[name] = lvl
        batch._set_counts(nsys, ncount, ecount, exact=True)
        return batch

    @classmethod
    def from_atoms(cls, atoms_list: Sequence[ase.Atoms] | ase.Atoms, device: Any = None, dtype: Any = None) -> Batch:
        """A batch from ASE ``Atoms`` objects, or from one ``Atoms`` (see ``AtomicData.from_atoms``);
        structures without tags, charges, magnetic moments or constraints get ASE's defaults when
        others have them, and ``info`` keys that only some structures have (or have in another
        form) are kept as JSON, so that each structure comes back with its own ``info``.

        Raises:
            InvalidDataError: A constraint alchemi cannot honour, or an ``info`` value it cannot hold.
        """
        import ase

        from alchemi_core.data.ase_io import fields_from_atoms, harmonise

        if isinstance(atoms_list, ase.Atoms):  # an Atoms is a sequence too: of Atom objects
            atoms_list = [atoms_list]
        dtype = dtype or torch.get_default_dtype()
        converted = [fields_from_atoms(a, dtype) for a in atoms_list]
        harmonise([f for f, _ in converted])
        return cls.from_data_list([AtomicData(levels=lv, **f) for f, lv in converted], device=device)

    @classmethod
    def empty(
        cls,
        num_systems: int,
        num_nodes: int,
        num_edges: int = 0,
        template: Batch | AtomicData | None = None,
        device: torch.device | str | None = None,
    ) -> Batch:
        """A pre-allocated, empty batch with room for ``num_systems`` systems holding at most
        ``num_nodes`` atoms and ``num_edges`` edges in all.

        The template gives the fields, their dtypes and trailing shapes; its values are not used.

        Example:
            >>> from alchemi_core.testing import make_batch
            >>> batch = make_batch([3, 2], edges=True)
            >>> buf = Batch.empty(num_systems=100, num_nodes=5000, num_edges=20000, template=batch)
            >>> len(buf), buf.system_capacity
            (0, 100)
        """
        if template is None:
            raise InvalidDataError("Batch.empty needs a template (a Batch or AtomicData) for its fields")
        if min(num_systems, num_nodes, num_edges) < 0:
            raise InvalidDataError("Batch.empty capacities must be non-negative")
        if isinstance(template, AtomicData):
            template = cls.from_data_list([template])
        dev = torch.device(device) if device is not None else template.device
        batch = cls(device=dev)
        caps = {_SYS: num_systems, _NODE: num_nodes, _EDGE: num_edges}
        for k, t in template._store.items():
            lvl = template._level[k]
            batch._store[k] = torch.zeros((caps[lvl], *t.shape[1:]), dtype=t.dtype, device=dev)
            batch._level[k] = lvl
        batch.__dict__["_cap"] = [num_systems, num_nodes, num_edges]
        batch.__dict__["_ncount"] = np.zeros(num_systems, dtype=np.int64)
        batch.__dict__["_ecount"] = np.zeros(num_systems, dtype=np.int64)
        batch._touch()
        return batch

    def _set_counts(self, nsys: int, ncount: np.ndarray, ecount: np.ndarray, exact: bool) -> None:
        d = self.__dict__
        d["_n"] = [nsys, int(ncount[:nsys].sum()), int(ecount[:nsys].sum())]
        if exact:
            d["_cap"] = list(d["_n"])
            d["_ncount"] = ncount.astype(np.int64).copy()
            d["_ecount"] = ecount.astype(np.int64).copy()
        else:
            d["_ncount"][:nsys] = ncount[:nsys]
            d["_ncount"][nsys:] = 0
            d["_ecount"][:nsys] = ecount[:nsys]
            d["_ecount"][nsys:] = 0
        self._touch()

    def _touch(self) -> None:
        """Forget cached views and pointers after the composition changed."""
        self.__dict__["_views"] = {}
        self.__dict__["_derived"] = {}
        self.__dict__["_version"] += 1

    # ------------------------------------------------------------------ sizes
    @property
    def num_graphs(self) -> int:
        """Number of systems held."""
        return self._n[0]

    @property
    def num_nodes(self) -> int:
        """Number of atoms held, over all systems."""
        return self._n[1]

    @property
    def num_edges(self) -> int:
        """Number of edges held, over all systems."""
        return self._n[2]

    @property
    def system_capacity(self) -> int:
        return self._cap[0]

    @property
    def node_capacity(self) -> int:
        return self._cap[1]

    @property
    def edge_capacity(self) -> int:
        return self._cap[2]

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def version(self) -> int:
        """Increases whenever the set of systems changes; models key neighbour caches on it."""
        return self._version

    @property
    def num_nodes_list(self) -> list[int]:
        return self._ncount[: self._n[0]].tolist()

    @property
    def num_edges_list(self) -> list[int]:
        return self._ecount[: self._n[0]].tolist()

    @property
    def num_nodes_per_system(self) -> np.ndarray:
        """Atoms per system as a host array (no device read)."""
        return self._ncount[: self._n[0]]

    @property
    def num_edges_per_system(self) -> np.ndarray:
        return self._ecount[: self._n[0]]

    def __len__(self) -> int:
        return self._n[0]

    def _derive(self, key: str) -> torch.Tensor:
        cache = self._derived
        t = cache.get(key)
        if t is None:
            nsys = self._n[0]
            counts = self._ncount[:nsys] if key in ("batch_ptr", "batch_idx", "node_counts") else self._ecount[:nsys]
            if key.endswith("ptr"):
                t = torch.from_numpy(_ptr(counts)).to(self._device)
            elif key.endswith("counts"):
                t = torch.from_numpy(counts.copy()).to(self._device)
            else:
                t = torch.repeat_interleave(
                    torch.arange(nsys, device=self._device), torch.from_numpy(counts.copy()).to(self._device),
                    output_size=int(counts.sum()),
                )
            cache[key] = t
        return t

    @property
    def batch_ptr(self) -> torch.Tensor:
        """``[B + 1]`` offsets of each system's first atom."""
        return self._derive("batch_ptr")

    @property
    def batch_idx(self) -> torch.Tensor:
        """``[V]`` the system index of every atom."""
        return self._derive("batch_idx")

    @property
    def edge_ptr(self) -> torch.Tensor:
        """``[B + 1]`` offsets of each system's first edge."""
        return self._derive("edge_ptr")

    @property
    def edge_batch_idx(self) -> torch.Tensor:
        """``[E]`` the system index of every edge."""
        return self._derive("edge_batch_idx")

    @property
    def node_counts(self) -> torch.Tensor:
        """``[B]`` atoms per system, on the batch's device."""
        return self._derive("node_counts")

    # ------------------------------------------------------------------ fields
    def _count(self, level: Level) -> int:
        return self._n[_ORDER.index(level)]

    def __getattr__(self, name: str) -> torch.Tensor:
        d = self.__dict__
        try:
            return d["_views"][name]
        except KeyError:
            pass
        store = d.get("_store")
        if store is not None and name in store:
            t = store[name]
            n = self._count(d["_level"][name])
            view = t if t.shape[0] == n else t[:n]
            d["_views"][name] = view
            return view
        raise AttributeError(
            f"Batch has no field {name!r}; it has {sorted(store) if store else []}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        else:
            self.set_field(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._store:
            del self._store[name]
            del self._level[name]
            self._views.pop(name, None)
        else:
            object.__delattr__(self, name)

    def set_field(self, name: str, value: Any, level: Level | str | None = None) -> None:
        """Store ``value`` as field ``name``.

        In a batch with spare capacity the value is copied into the field's buffer (allocated on
        first use), so addresses stay fixed; otherwise the tensor itself is stored.

        Raises:
            InvalidDataError: The leading dimension fits no level, or not the named one.
        """
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if t.device != self._device:
            t = t.to(self._device)
        lvl = Level(level) if level is not None else self._level.get(name)
        if lvl is None:
            lead = t.shape[0] if t.dim() else 1
            lvl = infer_level(name, lead, self._n[1], self._n[2], self._n[0])
        n = self._count(lvl)
        cap = self._cap[_ORDER.index(lvl)]
        if t.dim() == 0 or t.shape[0] != n:
            raise InvalidDataError(
                f"field {name!r} is {lvl.value}-level, so it needs {n} rows, got shape {list(t.shape)}"
            )
        check_values(name, t)
        old = self._store.get(name)
        if cap == n:
            self._store[name] = t
        else:
            if old is None or old.shape[1:] != t.shape[1:] or old.dtype != t.dtype:
                old = torch.zeros((cap, *t.shape[1:]), dtype=t.dtype, device=self._device)
                self._store[name] = old
            old[:n].copy_(t)
        self._level[name] = lvl
        self._views.pop(name, None)

    def keys(self) -> list[str]:
        return list(self._store)

    def __contains__(self, name: object) -> bool:
        return name in self._store

    @property
    def levels(self) -> dict[str, Level]:
        return dict(self._level)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self._store else default

    def level_of(self, name: str) -> Level:
        return self._level[name]

    def storage(self, name: str) -> torch.Tensor:
        """The whole buffer of a field, capacity rows included (for fixed-address kernels)."""
        return self._store[name]

    # ------------------------------------------------------------------ selection
    def _system_indices(self, index: Any) -> np.ndarray:
        nsys = self._n[0]
        if isinstance(index, slice):
            return np.arange(nsys, dtype=np.int64)[index]
        if isinstance(index, int):
            index = [index]
        if isinstance(index, torch.Tensor):
            if index.dtype == torch.bool:
                if index.numel() != nsys:
                    raise InvalidDataError(
                        f"boolean mask has {index.numel()} entries but the batch holds {nsys} systems"
                    )
                return np.nonzero(index.detach().cpu().numpy())[0].astype(np.int64)
            index = index.detach().cpu().numpy()
        arr = np.asarray(index, dtype=np.int64).reshape(-1)
        if arr.dtype == np.bool_:
            return np.nonzero(arr)[0].astype(np.int64)
        if arr.size and (arr.min() < -nsys or arr.max() >= nsys):
            raise IndexError(f"system index out of range for a batch of {nsys} systems")
        return np.where(arr < 0, arr + nsys, arr)

    def _gather_plan(self, sel: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
        """Row indices (node, edge, system) for systems ``sel``, and their counts."""
        ncnt, ecnt = self._ncount[sel], self._ecount[sel]
        nptr = _ptr(self._ncount[: self._n[0]])
        eptr = _ptr(self._ecount[: self._n[0]])
        dev = self._device
        node_idx = torch.from_numpy(_segment_index(nptr[sel], ncnt)).to(dev)
        edge_idx = torch.from_numpy(_segment_index(eptr[sel], ecnt)).to(dev)
        sys_idx = torch.from_numpy(sel.copy()).to(dev)
        return node_idx, edge_idx, sys_idx, ncnt, ecnt

    def _index_shift(self, sel: np.ndarray, ecnt: np.ndarray, new_node_start: int, ncnt: np.ndarray) -> torch.Tensor:
        """Per copied edge: how far its atom indices move (new first atom - old first atom)."""
        old_start = _ptr(self._ncount[: self._n[0]])[sel]
        new_start = new_node_start + np.concatenate(([0], np.cumsum(ncnt)[:-1])) if len(ncnt) else np.zeros(0, np.int64)
        delta = np.repeat(new_start - old_start, ecnt).astype(np.int64)
        return torch.from_numpy(delta).to(self._device)

    def index_select(self, index: Any) -> Batch:
        """A new batch holding the selected systems, in the order given.

        Args:
            index: An int, a slice, a sequence or tensor of indices, or a bool mask of length B.
        """
        sel = self._system_indices(index)
        node_idx, edge_idx, sys_idx, ncnt, ecnt = self._gather_plan(sel)
        out = Batch(device=self._device)
        idx = {_NODE: node_idx, _EDGE: edge_idx, _SYS: sys_idx}
        shift = None
        for k, t in self._store.items():
            lvl = self._level[k]
            n = self._count(lvl)
            if k in INDEX_FIELDS:
                if shift is None:
                    shift = self._index_shift(sel, ecnt, 0, ncnt)
                out._store[k] = t[:n].index_select(0, idx[lvl]) + shift.unsqueeze(-1)
            else:
                out._store[k] = t[:n].index_select(0, idx[lvl])
            out._level[k] = lvl
        out._set_counts(len(sel), ncnt, ecnt, exact=True)
        return out

    def __getitem__(self, i: int) -> AtomicData:
        if not isinstance(i, (int, np.integer)):
            raise TypeError("Batch[i] takes an int; use index_select for several systems")
        return self.index_select([int(i)]).to_data_list()[0]

    def __iter__(self) -> Iterator[AtomicData]:
        return iter(self.to_data_list())

    def to_data_list(self) -> list[AtomicData]:
        """Split into one ``AtomicData`` per system (copies)."""
        nsys = self._n[0]
        nptr, eptr = _ptr(self._ncount[:nsys]), _ptr(self._ecount[:nsys])
        out = []
        for i in range(nsys):
            fields = {}
            for k, t in self._store.items():
                lvl = self._level[k]
                if lvl is _NODE:
                    v = t[nptr[i] : nptr[i + 1]]
                elif lvl is _EDGE:
                    v = t[eptr[i] : eptr[i + 1]]
                    if k in INDEX_FIELDS:
                        v = v - int(nptr[i])
                else:
                    v = t[i : i + 1]
                fields[k] = v.clone()
            out.append(AtomicData._from_fields(fields, dict(self._level)))
        return out

    # ------------------------------------------------------------------ in-place buffer ops
    def _check_mask(self, mask: Any, n: int, what: str) -> torch.Tensor | None:
        if mask is None:
            return None
        m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
        if m.dtype != torch.bool:
            raise InvalidDataError(f"{what} mask must be a bool tensor, got dtype {m.dtype}")
        if m.dim() != 1 or m.numel() != n:
            raise InvalidDataError(
                f"{what} mask has shape {list(m.shape)} but the batch holds {n} systems; "
                f"pass a bool tensor of shape [{n}]"
            )
        return m

    def fit_count(self, src: Batch, sel: np.ndarray) -> int:
        """How many of ``src``'s systems ``sel`` (in order) fit in this batch's free room."""
        free_sys = self._cap[0] - self._n[0]
        free_node = self._cap[1] - self._n[1]
        free_edge = self._cap[2] - self._n[2]
        k = min(len(sel), free_sys)
        if k == 0:
            return 0
        nfit = np.searchsorted(np.cumsum(src._ncount[sel[:k]]), free_node, side="right")
        efit = np.searchsorted(np.cumsum(src._ecount[sel[:k]]), free_edge, side="right")
        return int(min(k, nfit, efit))

    def put(self, src: Batch, mask: torch.Tensor | None = None, ops: BufferOps | None = None) -> int:
        """Copy the systems of ``src`` where ``mask`` is True into this batch's free room.

        Systems are copied in order until the next one would not fit (systems, atoms or edges);
        nothing is allocated when the fields already exist. ``src`` remembers what was copied
        (``src._copied_mask``), so a bare ``src.defrag()`` removes exactly those systems; this
        batch records the slots written in ``_dest_mask``. ``ops`` does the row copies (default:
        :func:`~alchemi_core.data.buffer_ops.buffer_ops_for` the device).

        Returns:
            The number of systems copied.

        Raises:
            ValueError: The mask's length differs from ``src.num_graphs``.
            InvalidDataError: A field's dtype or shape differs between the batches.
        """
        m = self._check_mask(mask, src.num_graphs, "put")
        sel = np.arange(src.num_graphs, dtype=np.int64) if m is None else np.nonzero(m.detach().cpu().numpy())[0]
        k = self.fit_count(src, sel)
        self._put_selected(src, sel[:k], ops)
        return k

    def _put_selected(self, src: Batch, sel: np.ndarray, ops: BufferOps | None = None) -> None:
        """Copy systems ``sel`` of ``src`` (known to fit) to the end of this batch."""
        k = len(sel)
        nsys0, nn0, ne0 = self._n
        copied = np.zeros(src.num_graphs, dtype=bool)
        copied[sel] = True
        dest = np.zeros(self._cap[0], dtype=bool)
        dest[nsys0 : nsys0 + k] = True
        if k:
            if src._device != self._device:
                src = src.to(self._device)
            self._ensure_fields_like(src)
            ops = ops if ops is not None else buffer_ops_for(self._device)
            node_idx, edge_idx, sys_idx, ncnt, ecnt = src._gather_plan(sel)
            idx = {_NODE: node_idx, _EDGE: edge_idx, _SYS: sys_idx}
            start = {_NODE: nn0, _EDGE: ne0, _SYS: nsys0}
            missing = []
            for name, buf in self._store.items():
                lvl = self._level[name]
                lo, hi = start[lvl], start[lvl] + len(idx[lvl])
                if name not in src._store:
                    missing.append(buf[lo:hi])
                    continue
                s = src._store[name][: src._count(lvl)]
                if name in INDEX_FIELDS:
                    ops.gather_shifted(s, idx[lvl], src._index_shift(sel, ecnt, nn0, ncnt), buf[lo:hi])
                else:
                    ops.gather(s, idx[lvl], buf[lo:hi])
            if missing:
                ops.zero(missing)
            nc = self._ncount.copy()
            ec = self._ecount.copy()
            nc[nsys0 : nsys0 + k] = ncnt
            ec[nsys0 : nsys0 + k] = ecnt
            self._set_counts(nsys0 + k, nc, ec, exact=False)
        src.__dict__["_copied_mask"] = torch.from_numpy(copied).to(src._device)
        src.__dict__["_pending_defrag"] = src._copied_mask
        self.__dict__["_dest_mask"] = torch.from_numpy(dest).to(self._device)

    def _ensure_fields_like(self, src: Batch) -> None:
        """Give this batch every field ``src`` has (zeros in existing rows); check dtypes."""
        for name, t in src._store.items():
            lvl = src._level[name]
            mine = self._store.get(name)
            if mine is None:
                cap = self._cap[_ORDER.index(lvl)]
                self._store[name] = torch.zeros((cap, *t.shape[1:]), dtype=t.dtype, device=self._device)
                self._level[name] = lvl
                self._views.pop(name, None)
            elif mine.dtype != t.dtype or mine.shape[1:] != t.shape[1:] or self._level[name] != lvl:
                raise InvalidDataError(
                    f"field {name!r} is {t.dtype} {list(t.shape[1:])} ({lvl.value}) in the source but "
                    f"{mine.dtype} {list(mine.shape[1:])} ({self._level[name].value}) in the "
                    "destination buffer; build the buffer from a template with the same fields"
                )

    def defrag(self, mask: torch.Tensor | None = None, ops: BufferOps | None = None) -> Batch:
        """Remove systems in place and pack the rest to the front, keeping their order.

        Args:
            mask: Bool ``[B]``, True = remove. Default: the systems the last ``put`` from this
                batch copied elsewhere (nothing, if there was none).
            ops: The row copies (default: :func:`~alchemi_core.data.buffer_ops.buffer_ops_for`).

        Returns:
            This batch.
        """
        if mask is None:
            mask = self._pending_defrag
            if mask is None:
                return self
        m = self._check_mask(mask, self.num_graphs, "defrag")
        assert m is not None
        keep = np.nonzero(~m.detach().cpu().numpy())[0].astype(np.int64)
        self.__dict__["_pending_defrag"] = None
        if len(keep) == self.num_graphs:
            return self
        node_idx, edge_idx, sys_idx, ncnt, ecnt = self._gather_plan(keep)
        idx = {_NODE: node_idx, _EDGE: edge_idx, _SYS: sys_idx}
        shift = self._index_shift(keep, ecnt, 0, ncnt) if INDEX_FIELDS & self._store.keys() else None
        ops = ops if ops is not None else buffer_ops_for(self._device)
        for name, buf in self._store.items():
            lvl = self._level[name]
            rows = idx[lvl]
            # Gather into a temporary first: source and destination rows overlap.
            tmp = torch.empty((len(rows), *buf.shape[1:]), dtype=buf.dtype, device=self._device)
            if name in INDEX_FIELDS and shift is not None:
                ops.gather_shifted(buf[: self._count(lvl)], rows, shift, tmp)
            else:
                ops.gather(buf[: self._count(lvl)], rows, tmp)
            buf[: len(rows)].copy_(tmp)
        nc = np.zeros_like(self._ncount)
        ec = np.zeros_like(self._ecount)
        nc[: len(keep)] = ncnt
        ec[: len(keep)] = ecnt
        self._set_counts(len(keep), nc, ec, exact=False)
        return self

    def append(self, other: Batch) -> Batch:
        """Add all systems of ``other`` at the end, in place; grows the buffers if needed."""
        need = [self._n[0] + other._n[0], self._n[1] + other._n[1], self._n[2] + other._n[2]]
        if any(n > c for n, c in zip(need, self._cap)):
            self.reserve(*need)
        self._put_selected(other, np.arange(other.num_graphs, dtype=np.int64))
        self.__dict__["_dest_mask"] = None
        other.__dict__["_pending_defrag"] = None
        other.__dict__["_copied_mask"] = None
        return self

    def reserve(self, num_systems: int, num_nodes: int, num_edges: int) -> Batch:
        """Grow the capacity to at least the given rows (reallocates; contents kept)."""
        new_cap = [max(a, b) for a, b in zip(self._cap, (num_systems, num_nodes, num_edges))]
        if new_cap == self._cap:
            return self
        for name, buf in self._store.items():
            lvl = self._level[name]
            j = _ORDER.index(lvl)
            grown = torch.zeros((new_cap[j], *buf.shape[1:]), dtype=buf.dtype, device=self._device)
            grown[: self._n[j]].copy_(buf[: self._n[j]])
            self._store[name] = grown
        grow = new_cap[0] - self._cap[0]
        self.__dict__["_ncount"] = np.concatenate([self._ncount, np.zeros(grow, np.int64)])
        self.__dict__["_ecount"] = np.concatenate([self._ecount, np.zeros(grow, np.int64)])
        self.__dict__["_cap"] = new_cap
        self._touch()
        return self

    def trim(self) -> Batch:
        """Drop spare capacity, in place (reallocates to the exact contents)."""
        for name, buf in self._store.items():
            n = self._count(self._level[name])
            self._store[name] = buf[:n].clone()
        nsys = self._n[0]
        self._set_counts(nsys, self._ncount[:nsys], self._ecount[:nsys], exact=True)
        return self

    def zero(self, ops: BufferOps | None = None) -> Batch:
        """Empty the batch and zero its buffers (with ``ops``, default the device's); the memory
        (and its addresses) is kept."""
        (ops if ops is not None else buffer_ops_for(self._device)).zero(list(self._store.values()))
        self._ncount[:] = 0
        self._ecount[:] = 0
        self.__dict__["_n"] = [0, 0, 0]
        self.__dict__["_pending_defrag"] = None
        self._touch()
        return self

    # ------------------------------------------------------------------ copies
    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy on ``device`` with the same capacity (self when already there)."""
        dev = torch.device(device)
        if dev == self._device:
            return self
        return self._copy({k: v.to(dev, non_blocking=non_blocking) for k, v in self._store.items()}, dev)

    def clone(self) -> Batch:
        """A deep copy with the same capacity."""
        return self._copy({k: v.clone() for k, v in self._store.items()}, self._device)

    def _copy(self, store: dict[str, torch.Tensor], device: torch.device) -> Batch:
        out = Batch(device=device)
        out._store.update(store)
        out._level.update(self._level)
        out.__dict__["_cap"] = list(self._cap)
        out.__dict__["_ncount"] = self._ncount.copy()
        out.__dict__["_ecount"] = self._ecount.copy()
        out.__dict__["_n"] = list(self._n)
        return out

    def to_atoms(self) -> list[ase.Atoms]:
        """One ASE ``Atoms`` per system."""
        return [d.to_atoms() for d in self.to_data_list()]

    def __repr__(self) -> str:
        cap = "" if self._cap == self._n else f", capacity={tuple(self._cap)}"
        return (
            f"Batch(num_graphs={self._n[0]}, num_nodes={self._n[1]}, num_edges={self._n[2]}"
            f"{cap}, fields={sorted(self._store)}, device={self._device})"
        )

"""The pair potentials' and neighbour lists' per-device choices (:class:`PotentialsTuning`), taken
as ``tuning=`` by :class:`~alchemi_potentials.LennardJones`, :class:`~alchemi_potentials.Morse` and
:class:`~alchemi_potentials.BatchedNeighborList` (default: :meth:`PotentialsTuning.for_device`).
Every choice gives the same pairs and forces to rounding.

Example:
    >>> import attrs
    >>> from alchemi_potentials.tuning import PotentialsTuning
    >>> PotentialsTuning.for_device("cuda").matrix_order, PotentialsTuning.for_device("cpu").matrix_order
    ('columns', 'rows')
    >>> attrs.evolve(PotentialsTuning.for_device("cuda"), fast_math=False).fast_math
    False
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from alchemi_core.tuning import CoreTuning


@attrs.frozen
class PotentialsTuning:
    """How the pair kernel and the neighbour search run on one kind of device.

    Attributes:
        unroll: Neighbours per iteration of the pair kernel (1, 2 or 4): 4 loads ahead on a GPU.
        masked: Pairs past the cutoff multiplied by zero rather than branched around (a CPU
            mispredicts the branch; W6 1-4 % faster).
        lanes: A CPU's pair kernel takes a slot's neighbours in SIMD lanes
            (:mod:`~alchemi_potentials.pair_lanes`), for the variants it covers.
        lane_width: Neighbours per block of the lanes' native loop (eight float32 lanes of AVX2).
        wide_lane_width: The same where the compiler targets AVX-512 (W6 1.95-2.06 against
            2.21-2.48 ms a step at 8).
        fast_math: The GPU's pair kernel compiled with fast math (approximate float32 division;
            W1 256x1024 0.333 -> 0.296 ms a step).
        min_blocks_large: Blocks of 256 pair-kernel threads that must fit on one multiprocessor
            in the variant for large systems (0: the compiler's choice; W1 1 x 2^20 atoms 0.7585
            -> 0.7271 ms a step).
        skin: A neighbour list's Verlet skin (Å) where none is given (W1 256x1024 0.295 ms at 0.5
            against 0.264 at 1.0 Å).
        half_list: A list made with ``half_list=None`` lists each pair once: a CPU halves its work
            by Newton's third law; a GPU's threads write only their own atom.
        search_trim: The search skips the bins of a slot's box wholly beyond the list radius (a
            CPU's search costs what it walks; W6's search 1.51 against 1.98 ms of thread time).
        matrix_order: The neighbour matrix's memory order: ``"columns"`` (a GPU warp reads one
            row, coalesced) or ``"rows"`` (each slot's entries contiguous, for a CPU).
        search_parts: Threads per slot of a build's search where parts pay
            (``layout.search_parts``; W1 108x2048 0.447 -> 0.365 ms a step at 9).
        search_listed: The search walks a list of the rebuilding slots instead of every slot (on
            a CPU the list's own kernels cost more than the idle slots they spare).
        join_fraction: A list's ``join_fraction`` where none is given (rebuilds in cohorts; W1
            256x1024 0.288 / 0.264 ms a step at 0.9 / 0.8).
        force_search_parts: Threads per slot whatever the batch, instead of the rule (None): for
            measurements and tests.
    """

    unroll: int = attrs.field(validator=attrs.validators.in_((1, 2, 4)))
    masked: bool
    lanes: bool
    fast_math: bool
    min_blocks_large: int
    skin: float
    half_list: bool
    search_trim: bool
    matrix_order: Literal["columns", "rows"] = attrs.field(validator=attrs.validators.in_(("columns", "rows")))
    search_parts: int
    search_listed: bool
    join_fraction: float
    lane_width: int = 8
    wide_lane_width: int = 16
    force_search_parts: int | None = None

    @classmethod
    def for_device(cls, device: str | torch.device) -> PotentialsTuning:
        """The measured choices for ``device`` (``"cuda"``, ``"cpu"``, a ``torch.device``); other
        device types get the CPU's."""
        if CoreTuning.device_type(device) == "cuda":
            return cls(unroll=4, masked=False, lanes=False, fast_math=True, min_blocks_large=4, skin=1.0,
                       half_list=False, search_trim=False, matrix_order="columns", search_parts=9,
                       search_listed=True, join_fraction=0.8)
        return cls(unroll=1, masked=True, lanes=True, fast_math=False, min_blocks_large=0, skin=1.0,
                   half_list=True, search_trim=True, matrix_order="rows", search_parts=1,
                   search_listed=False, join_fraction=1.0)

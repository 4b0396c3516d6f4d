"""Atomic structures: ``AtomicData`` (one) and ``Batch`` (many), and the dataset interfaces.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> data = AtomicData(atomic_numbers=torch.tensor([6, 8]), positions=torch.zeros(2, 3))
    >>> Batch.from_data_list([data, data]).num_nodes
    4
"""

from __future__ import annotations

from alchemi_core.data.atomic_data import AtomicData
from alchemi_core.data.batch import Batch
from alchemi_core.data.fields import Level, register_field

__all__ = ["AtomicData", "Batch", "Level", "register_field"]

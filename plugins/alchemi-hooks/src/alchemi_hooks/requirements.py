"""The check every hook makes when a run starts: does the batch carry the fields it reads?

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_hooks.requirements import require_fields
    >>> require_fields(make_batch([2]), ("positions", "cell"), who="WrapPeriodicHook", fix="")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def require_fields(batch: Batch, names: Iterable[str], who: str, fix: str) -> None:
    """Raise ``ConfigurationError`` naming the fields the batch lacks, what it has, and ``fix``."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise ConfigurationError(
            f"{who} reads fields {missing} that the batch lacks; it has {sorted(batch.keys())}. {fix}".rstrip()
        )

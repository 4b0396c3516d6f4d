"""Model files by name, offline first: where a named model's file is looked for and the one
error a missing file or a failed download gives (``model:mace``, ``model:sevennet``).

A name's file is looked for as ``$ALCHEMI_MODEL_DIR/<file>`` and then where the model's package
keeps its downloads; the package's own loader downloads it only when the user passes
``download=True``. Either way a file that is not there ends in one
:class:`~alchemi_core.errors.ModelNotAvailableError` that says which file to place where.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open(os.path.join(folder, "m.pth"), "w").close()
    >>> local_file("model:x", "x-1", "m.pth", "https://example.org/m.pth", [os.path.join(folder, "m.pth")], None,
    ...            False) == os.path.join(folder, "m.pth")
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from alchemi_core.errors import ModelNotAvailableError
from alchemi_core.models.base import MODEL_DIR_VARIABLE


def find_file(file: str, package_places: Sequence[str]) -> str | None:
    """The first of ``$ALCHEMI_MODEL_DIR/<file>`` and ``package_places`` that exists, or None."""
    return next((p for p in _places(file, package_places) if os.path.isfile(p)), None)


def _places(file: str, package_places: Sequence[str]) -> list[str]:
    own = os.environ.get(MODEL_DIR_VARIABLE)
    return [*([os.path.join(own, file)] if own else []), *package_places]


def local_file(who: str, name: str, file: str, url: str, package_places: Sequence[str],
               fetch: Callable[[], str] | None, download: bool) -> str:
    """The path of the file ``name`` stands for.

    Args:
        who: The component, for messages (``"model:mace"``).
        name: The name the user gave.
        file: The file's name as published (the end of ``url``), looked for in ``$ALCHEMI_MODEL_DIR``.
        url: Where the package downloads it from (for the message).
        package_places: Paths where the package keeps it, the user-writable one last.
        fetch: The package's own download, returning the file's path (None: it has none to call).
        download: The user allowed the download.

    Raises:
        ModelNotAvailableError: The file is not here (which file to place where, or
            ``download=True``), or the download failed (no network).
    """
    found = find_file(file, package_places)
    if found is not None:
        return found
    own = os.environ.get(MODEL_DIR_VARIABLE)
    places = _places(file, package_places)
    put = f"place {file} (from {url}) " + (
        f"in {own} (${MODEL_DIR_VARIABLE})" if own else f"at {places[-1]}, or in the directory ${MODEL_DIR_VARIABLE} names"
    )
    if fetch is None or not download:
        allow = "or pass download=True to let its package download it" if fetch is not None else \
            "its package downloads it only inside its own calculator"
        raise ModelNotAvailableError(f"{who}: {name!r} is not on this machine: {put}; {allow}")
    try:
        return fetch()
    except OSError as exc:  # requests' ConnectionError, urllib's URLError, socket timeouts
        raise ModelNotAvailableError(
            f"{who}: could not download {name!r} ({type(exc).__name__}: {exc}); without a network, {put}"
        ) from None
